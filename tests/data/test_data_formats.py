"""The generic feature format: npz and h5, lengths, labels, splits, standardisation,
non-finite values and the errors for broken files."""

import logging

import h5py
import numpy as np
import pytest

from polyfuse.data import load_arrays, load_source, prepare_data
from polyfuse.data.sources import parse_synthetic, synthetic_table

TASK = {"type": "sentiment"}


def arrays(n=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, n)
    sequence = rng.normal(3.0, 2.0, (n, 5, 4)).astype(np.float32)
    sequence[np.arange(5)[None, :] >= lengths[:, None]] = 99.0  # padding content must never matter
    return {
        "seq": sequence,
        "seq_lengths": lengths,
        "vec": rng.normal(-1.0, 5.0, (n, 3)).astype(np.float32),
        "label": rng.uniform(-3, 3, n).astype(np.float32),
        "split": np.array(["train"] * 30 + ["test"] * 10),
        "speaker": np.repeat(np.arange(10), 4).astype(str),
    }


def data_config(**changes):
    config = {"modalities": ["seq", "vec"], "split": "split", "group": "speaker", "validation_fraction": 0.25}
    config.update(changes)
    return config


@pytest.fixture
def npz_file(tmp_path):
    path = tmp_path / "features.npz"
    np.savez(path, **arrays())
    return path


def test_npz_shapes_lengths_and_padding(npz_file):
    data = prepare_data(load_arrays(npz_file), data_config(), TASK, label_kind="score")
    assert data.modalities == ["seq", "vec"]
    assert data.input_dims == [4, 3]
    assert data.features[0].shape == (40, 5, 4) and data.features[1].shape == (40, 1, 3)
    raw = arrays()
    np.testing.assert_array_equal(data.lengths[0], raw["seq_lengths"])
    padded = np.arange(5)[None, :] >= raw["seq_lengths"][:, None]
    assert np.all(data.features[0][padded] == 0.0)  # padding zeroed, 99 never leaks
    assert set(data.splits) == {"train", "val", "test"}
    np.testing.assert_array_equal(data.splits["test"].rows, np.arange(30, 40))


def test_h5_reads_like_npz(tmp_path, npz_file):
    path = tmp_path / "features.h5"
    with h5py.File(path, "w") as handle:
        for key, value in arrays().items():
            handle[key] = value.astype("S") if value.dtype.kind == "U" else value
    from_h5 = prepare_data(load_arrays(path), data_config(), TASK, label_kind="score")
    from_npz = prepare_data(load_arrays(npz_file), data_config(), TASK, label_kind="score")
    for a, b in zip(from_h5.features, from_npz.features, strict=True):
        np.testing.assert_array_equal(a, b)
    for key in ("train", "val", "test"):
        np.testing.assert_array_equal(from_h5.splits[key].rows, from_npz.splits[key].rows)


def test_standardised_on_training_rows_only(tmp_path):
    raw = arrays()
    data = prepare_data(load_source(_save(tmp_path, raw)), data_config(), TASK, label_kind="score")
    train = data.splits["train"].rows
    real = np.arange(5)[None, :] < raw["seq_lengths"][train][:, None]
    steps = data.features[0][train][real]
    np.testing.assert_allclose(steps.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(steps.std(axis=0), 1.0, atol=1e-4)
    # Changing validation and test rows changes no statistic.
    changed = dict(raw)
    changed["vec"] = raw["vec"].copy()
    held_out = np.setdiff1d(np.arange(40), train)
    changed["vec"][held_out] += 1000.0
    again = prepare_data(load_source(_save(tmp_path, changed, "changed.npz")), data_config(), TASK, label_kind="score")
    np.testing.assert_array_equal(again.stats["vec"].mean, data.stats["vec"].mean)
    np.testing.assert_allclose(again.features[1][train], data.features[1][train])


def test_constant_feature_becomes_zero_not_nan(tmp_path):
    raw = arrays()
    raw["vec"][:, 1] = 7.0
    data = prepare_data(load_source(_save(tmp_path, raw)), data_config(), TASK, label_kind="score")
    assert np.all(data.features[1][:, 0, 1] == 0.0)


def _save(tmp_path, raw, name="f.npz"):
    path = tmp_path / name
    np.savez(path, **raw)
    return str(path)


def test_nonfinite_error_names_file_modality_and_row(tmp_path):
    raw = arrays()
    raw["vec"][17, 2] = np.nan
    path = _save(tmp_path, raw)
    with pytest.raises(ValueError, match=r"f\.npz: modality 'vec' has NaN at row 17 \(step 0, feature 2\)"):
        prepare_data(load_source(path), data_config(), TASK, label_kind="score")
    raw["vec"][17, 2] = np.inf
    with pytest.raises(ValueError, match=r"modality 'vec' has Inf at row 17"):
        prepare_data(load_source(_save(tmp_path, raw)), data_config(), TASK, label_kind="score")


def test_nonfinite_in_padding_is_ignored(tmp_path):
    raw = arrays()
    row = int(np.flatnonzero(raw["seq_lengths"] < 5)[0])
    raw["seq"][row, 4] = np.nan
    data = prepare_data(load_source(_save(tmp_path, raw)), data_config(), TASK, label_kind="score")
    assert np.isfinite(data.features[0]).all()


@pytest.mark.parametrize("policy", ["zero", "mean"])
def test_nonfinite_imputation_is_logged(tmp_path, caplog, policy):
    raw = arrays()
    raw["vec"][3, 0] = np.nan
    with caplog.at_level(logging.WARNING):
        data = prepare_data(load_source(_save(tmp_path, raw)), data_config(nonfinite=policy), TASK, label_kind="score")
    assert "imputing 1 non-finite value(s) of modality 'vec'" in caplog.text
    stats = data.stats["vec"]
    value = data.features[1][3, 0, 0]
    expected = (0.0 - stats.mean[0]) / stats.std[0] if policy == "zero" else 0.0
    assert value == pytest.approx(expected, abs=1e-5)


def test_broken_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_arrays(tmp_path / "missing.npz")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ValueError, match=r"corrupt\.npz: cannot read as \.npz"):
        load_arrays(corrupt)
    not_h5 = tmp_path / "bad.h5"
    not_h5.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"bad\.h5: cannot read as HDF5"):
        load_arrays(not_h5)
    with pytest.raises(ValueError, match=r"unknown data format '\.csv'"):
        (tmp_path / "x.csv").write_text("1,2\n")
        load_arrays(tmp_path / "x.csv")
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, seq=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="object \\(pickled\\) arrays, which are never loaded"):
        load_arrays(pickled)


def test_mismatched_arrays_give_clear_errors(tmp_path):
    raw = arrays()
    with pytest.raises(ValueError, match=r"no array 'text' \(wanted as a modality\); arrays in the file: label, seq"):
        prepare_data(load_source(_save(tmp_path, raw)), data_config(modalities=["text"]), TASK, label_kind="score")
    short = dict(raw, vec=raw["vec"][:39])
    with pytest.raises(ValueError, match="modality 'vec' has 39 rows, 'seq' has 40"):
        prepare_data(load_source(_save(tmp_path, short)), data_config(), TASK, label_kind="score")
    bad_lengths = dict(raw, seq_lengths=np.where(np.arange(40) == 5, 9, raw["seq_lengths"]))
    with pytest.raises(ValueError, match=r"'seq_lengths' is 9 at row 5; every length must lie in \[0, 5\]"):
        prepare_data(load_source(_save(tmp_path, bad_lengths)), data_config(), TASK, label_kind="score")
    bad_split = dict(raw, split=np.array(["train"] * 39 + ["holdout"]))
    with pytest.raises(ValueError, match=r"unknown split value\(s\) \['holdout'\]"):
        prepare_data(load_source(_save(tmp_path, bad_split)), data_config(), TASK, label_kind="score")
    bad_label = dict(raw, label=np.where(np.arange(40) == 8, np.nan, raw["label"]).astype(np.float32))
    with pytest.raises(ValueError, match="the label of row 8 is not finite"):
        prepare_data(load_source(_save(tmp_path, bad_label)), data_config(), TASK, label_kind="score")
    with pytest.raises(ValueError, match="name the modalities"):
        prepare_data(load_source(_save(tmp_path, raw)), data_config(modalities=None), TASK, label_kind="score")
    with pytest.raises(ValueError, match=r"no array 'nope' \(wanted as group\)"):
        prepare_data(load_source(_save(tmp_path, raw)), data_config(group="nope"), TASK, label_kind="score")


def test_labels_per_task(tmp_path):
    raw = arrays()
    raw["traits"] = np.stack([np.arange(40) % 7 + 1, np.arange(40) % 5 + 1], axis=1).astype(np.float32)
    raw["kind"] = np.array(["cat", "dog", "eel", "dog"] * 10)
    path = _save(tmp_path, raw)
    traits = prepare_data(load_source(path), data_config(label="traits"), {"type": "traits"}, label_kind="scores")
    assert traits.targets.shape == (40, 2)
    assert traits.label_info == {
        "names": ["t0", "t1"], "ranges": [[1.0, 7.0], [1.0, 5.0]], "columns": [0, 1], "checked": [False, False]
    }
    classes = prepare_data(load_source(path), data_config(label="kind"), {"type": "classification"}, label_kind="class")
    assert classes.label_info == {"classes": ["cat", "dog", "eel"]}
    assert classes.targets[:4].tolist() == [0, 1, 2, 1]
    with pytest.raises(ValueError, match="sentiment labels must have shape"):
        prepare_data(load_source(path), data_config(label="traits"), TASK, label_kind="score")


def test_synthetic_source():
    table = synthetic_table("synthetic:samples=50,modalities=2,lengths=6/7,dims=3/4,seed=3")
    assert table.arrays["m0"].shape == (50, 6, 3) and table.arrays["m1"].shape == (50, 7, 4)
    assert set(np.unique(table.arrays["label"])) <= {-1.0, 1.0}
    assert (table.arrays["split"] == "test").sum() == 10
    assert np.all(table.arrays["m0_lengths"] <= 6)
    same = synthetic_table("synthetic:samples=50,modalities=2,lengths=6/7,dims=3/4,seed=3")
    np.testing.assert_array_equal(table.arrays["m1"], same.arrays["m1"])
    assert parse_synthetic("synthetic")["samples"] == 1000
    with pytest.raises(ValueError, match="bad synthetic option 'sample=5'; write key=value with keys: samples"):
        parse_synthetic("synthetic:sample=5")
    with pytest.raises(ValueError, match="not a valid number"):
        parse_synthetic("synthetic:noise=loud")
