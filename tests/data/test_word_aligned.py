"""The word-aligned MFN layout: tiny files built here, read back against values
computed by hand, clear errors for inconsistent files, and a run end to end."""

import h5py
import numpy as np
import pytest

from polyfuse.data import encode_labels, prepare_data
from polyfuse.data.formats import load_word_aligned
from polyfuse.data.sources import load_source
from polyfuse.engine.config import deep_merge, resolve_config
from polyfuse.engine.run import train

DIMS = {"text": 4, "audio": 3, "video": 2}
STEPS = 5
SIZES = {"train": 12, "valid": 4, "test": 4}  # the release's file suffixes


def write(path, array):
    with h5py.File(path, "w") as handle:
        handle.create_dataset("d1", data=array)


def make_dir(root, *, targets=3, low=1.0, high=7.0, seed=0, name="pom"):
    """Left-padded sequences (zeros first); row 1 of every split has no audio."""
    rng = np.random.default_rng(seed)
    folder = root / name
    folder.mkdir(parents=True)
    for split, count in SIZES.items():
        for modality, dim in DIMS.items():
            array = np.zeros((count, STEPS, dim), dtype=np.float32)
            for row in range(count):
                length = 1 + (row + len(modality)) % STEPS
                array[row, STEPS - length :] = rng.normal(size=(length, dim)) + 0.5
            if modality == "audio":
                array[1] = 0.0  # a missing modality
            write(folder / f"{modality}_{split}.h5", array)
        write(folder / f"y_{split}.h5", rng.uniform(low, high, size=(count, targets)).astype(np.float32))  # high: per column too
    return folder


def test_left_padding_is_moved_to_the_front_with_lengths(tmp_path):
    folder = make_dir(tmp_path)
    table = load_word_aligned(folder)
    with h5py.File(folder / "text_valid.h5") as handle:
        raw = handle["d1"][()]
    rows = np.flatnonzero(table.arrays["split"] == "valid")
    assert table.arrays["sample_index"][rows].tolist() == [0, 1, 2, 3]
    for i, row in enumerate(rows):
        length = 1 + (i + 4) % STEPS  # as written: the last `length` steps are real
        assert table.arrays["text_lengths"][row] == length
        np.testing.assert_array_equal(table.arrays["text"][row, :length], raw[i, STEPS - length :])
        assert not table.arrays["text"][row, length:].any()
    audio_lengths = table.arrays["audio_lengths"]
    assert audio_lengths[np.flatnonzero(table.arrays["split"] == "train")[1]] == 0  # missing, not refused
    assert table.arrays["label"].shape == (20, 3)


def test_right_padding_is_read_as_is_when_stated(tmp_path):
    folder = make_dir(tmp_path)
    with h5py.File(folder / "video_train.h5") as handle:
        raw = handle["d1"][()]
    table = load_word_aligned(folder, padding="right")
    # read as right padding, the real steps stay where they are and the length runs to the last one
    np.testing.assert_array_equal(table.arrays["video"][:12], raw)
    assert table.arrays["video_lengths"][0] == STEPS


def test_errors_name_the_file_and_array(tmp_path):
    folder = make_dir(tmp_path / "a")
    write(folder / "audio_test.h5", np.ones((4, STEPS, 9), dtype=np.float32))
    with pytest.raises(ValueError, match=r"audio_test\.h5: modality 'audio' has \(T, d\) = \(5, 9\).*disagree"):
        load_word_aligned(folder)
    folder = make_dir(tmp_path / "b", high=8.0, seed=3)
    table = load_word_aligned(folder)  # ranges are checked where the task names them
    with pytest.raises(ValueError, match=r"y_train\.h5 row \d+: label t\d = 7\.\d+ lies outside its range \[1, 7\] "
                                         r"\(task.target_ranges\)"):
        prepare_data(table, POM_DATA, {"type": "traits", "target_ranges": [[1, 7]] * 3}, label_kind="scores")
    folder = make_dir(tmp_path / "c")
    (folder / "video_valid.h5").unlink()
    with pytest.raises(ValueError, match=r"modality 'video' is present in split\(s\) \['train', 'test'\] but missing in \['valid'\]"):
        load_word_aligned(folder)
    folder = make_dir(tmp_path / "d")
    mixed = np.zeros((4, STEPS, 2), dtype=np.float32)
    mixed[0, :2] = 1.0
    mixed[1, 3:] = 1.0
    write(folder / "video_test.h5", mixed)
    with pytest.raises(ValueError, match=r"video_test\.h5: the zero padding is neither"):
        load_word_aligned(folder)


def test_mmmo_scale_is_checked_by_name(tmp_path):
    folder = make_dir(tmp_path, targets=1, low=0.0, high=0.5, name="mmmo")
    with pytest.raises(ValueError, match=r"y_train\.h5 row 0: label label = 0\.\d+ lies outside its range \[1, 5\] "
                                         r"\(the documented scale of mmmo\)"):
        prepare_data(load_source(str(folder)), POM_DATA, {"type": "sentiment"}, label_kind="score")


def test_traits_with_a_missing_modality_train_end_to_end_on_mult(tmp_path):
    folder = make_dir(tmp_path)
    config = resolve_config(deep_merge({}, {
        "output_dir": str(tmp_path / "runs"), "seed": 0,
        "task": {"type": "traits", "target_names": ["a", "b", "c"], "target_ranges": [[1, 7]] * 3},
        "data": {"source": str(folder), "modalities": ["text", "audio", "video"], "split": "split",
                 "padding": "left", "batch_size": 8},
        "model": {"backbone": "mult", "fusion": "man", "fusion_dim": 4,
                  "options": {"mult": {"dim": 4, "heads": 2, "layers": 1},
                              "man": {"hidden_dim": 4, "heads": 2, "num_random_features": 4, "chunks": 2}}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "progress_bar": False, "quiet": True,
                    "num_threads": 1, "patience": 0},
    }))
    result = train(config, run_dir=tmp_path / "run")
    assert {"mae", "mae/a", "mae/c"} <= set(result.test)
    assert np.isfinite(list(result.test.values())).all()


POM_DATA = {"modalities": ["text", "audio", "video"], "split": "split", "padding": "left"}


def test_trait_ranges_come_from_the_documented_scale_not_the_training_maximum(tmp_path):
    """POM's traits named: confident is rated 1-7 (MA7), reserved and humorous 1-5 (MA5, the
    paper's Table 2), whatever the training maximum."""
    table = load_word_aligned(make_dir(tmp_path, low=1.0, high=4.5))
    assert table.arrays["label"].max() < 4.5
    task = {"type": "traits", "target_names": ["confident", "Reserved", "hum"]}
    prepared = prepare_data(table, POM_DATA, task, label_kind="scores")
    assert prepared.label_info["ranges"] == [[1.0, 7.0], [1.0, 5.0], [1.0, 5.0]]
    assert prepared.label_info["checked"] == [True] * 3
    # the config still wins over the documented scale, per column or per name
    prepared = prepare_data(table, POM_DATA, {**task, "target_ranges": [[0, 9]] * 3}, label_kind="scores")
    assert prepared.label_info["ranges"] == [[0.0, 9.0]] * 3
    prepared = prepare_data(table, POM_DATA, {**task, "target_ranges": {"hum": [0, 6]}}, label_kind="scores")
    assert prepared.label_info["ranges"] == [[1.0, 7.0], [1.0, 5.0], [0.0, 6.0]]


def test_ranges_from_training_labels_are_announced(caplog):
    raw = np.array([[1.2], [5.6], [3.0]], dtype=np.float32)
    with caplog.at_level("WARNING"):
        _, info = encode_labels(raw, "scores", np.arange(3), {"type": "traits"}, origin="f.npz")
    assert info["ranges"] == [[1.0, 6.0]]
    assert "f.npz: trait ranges taken from the training labels (t0 [1.0, 6.0])" in caplog.text


def test_one_trait_on_request_by_name_or_column(tmp_path):
    table = load_word_aligned(make_dir(tmp_path))
    labels = table.arrays["label"]
    names = ["confident", "passionate", "voice"]
    for wanted, column in ((["passionate"], 1), ([2], 2)):
        task = {"type": "traits", "target_names": names, "targets": wanted}
        prepared = prepare_data(table, POM_DATA, task, label_kind="scores")
        np.testing.assert_array_equal(prepared.targets, labels[:, [column]])
        assert prepared.label_info == {
            "names": [names[column]], "ranges": [[1.0, 7.0]], "columns": [column], "checked": [True]
        }
    # two traits, in the order asked for
    prepared = prepare_data(table, POM_DATA, {"type": "traits", "target_names": names, "targets": ["voice", 0]}, label_kind="scores")
    np.testing.assert_array_equal(prepared.targets, labels[:, [2, 0]])
    # a checkpoint's label_info reads the same columns back
    again, info = encode_labels(labels, "scores", np.arange(len(labels)), {"type": "traits"}, origin="x",
                                label_info=prepared.label_info)
    np.testing.assert_array_equal(again, labels[:, [2, 0]])
    assert info["names"] == ["voice", "confident"]
    for wanted, message in ((["loud"], r"names 'loud', not one of the target_names"),
                            ([3], r"names column 3; the labels have 3 \(0 to 2\)"),
                            ([1, "passionate"], r"names a target twice")):
        with pytest.raises(ValueError, match=message):
            prepare_data(table, POM_DATA, {"type": "traits", "target_names": names, "targets": wanted}, label_kind="scores")


def _cli_config(tmp_path, folder, **data):
    import yaml

    config = {
        "output_dir": str(tmp_path / "runs"), "seed": 0,
        "task": {"type": "traits", "target_names": ["a", "b"], "target_ranges": [[1, 7]] * 2},
        "data": {"source": str(folder), "batch_size": 8, **data},
        "model": {"fusion": "concat", "fusion_dim": 4, "out_dim": 4, "encoder": {"hidden_dim": 4}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "num_threads": 1, "patience": 0},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_cli_reads_a_folder_without_text_from_data_modalities(tmp_path, capsys):
    """A release without one modality: the config's modalities are read, the rest never asked for."""
    from polyfuse.cli.main import EXIT_INPUT, main

    folder = make_dir(tmp_path, targets=2)
    for split in SIZES:
        (folder / f"text_{split}.h5").unlink()
    quiet = ["--no-progress", "--quiet"]
    config = _cli_config(tmp_path, folder, modalities=["video", "audio"])
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "video"), *quiet]) == 0
    import yaml

    assert yaml.safe_load((tmp_path / "video" / "config.yaml").read_text())["data"]["modalities"] == ["video", "audio"]
    # no data.modalities: every modality present, in the order text, audio, video
    config = _cli_config(tmp_path, folder)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "all"), *quiet]) == 0
    best = tmp_path / "all" / "checkpoints" / "best.safetensors"
    assert main(["evaluate", "--checkpoint", str(best), "--split", "val"]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--modalities", "text,audio", *quiet]) == EXIT_INPUT
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert f"{folder}: no text_train.h5" in lines[0] and "modalities present: audio, video" in lines[0]


def test_only_the_asked_modalities_are_opened(tmp_path):
    folder = make_dir(tmp_path)
    (folder / "text_valid.h5").write_bytes(b"not hdf5")  # never read when text is not asked for
    table = load_word_aligned(folder, modalities=["audio", "video"])
    assert {"audio", "video", "audio_lengths"} <= set(table.arrays) and "text" not in table.arrays
    assert table.modalities == ("audio", "video")
    with pytest.raises(ValueError, match=r"text_valid\.h5: cannot read as HDF5"):
        load_word_aligned(folder)  # all present: text too


def test_a_real_pom_release_is_read_unnamed_and_its_one_to_five_traits_score_ma5(tmp_path, caplog):
    """A test label of 0.667 (an average of ratings) was refused by [1, 7] for every trait:
    unnamed traits take their ranges from the training labels, with a warning that says so."""
    folder = make_dir(tmp_path, targets=2, low=1.0, high=5.0)
    with h5py.File(folder / "y_test.h5", "r+") as handle:
        handle["d1"][2, 1] = 0.667
    table = load_word_aligned(folder)
    with caplog.at_level("WARNING"):
        prepared = prepare_data(table, POM_DATA, {"type": "traits"}, label_kind="scores")
    assert prepared.label_info["checked"] == [False, False]
    assert "trait ranges taken from the training labels" in caplog.text and "documents scales" in caplog.text
    # named, humorous is 1-5: the label is refused naming the file and the row within it
    task = {"type": "traits", "target_names": ["confident", "humorous"]}
    with pytest.raises(ValueError, match=rf"^{folder / 'y_test.h5'} row 2: label humorous = 0\.667 lies outside its "
                                         r"range \[1, 5\] \(the documented scale of pom\); fix the file"):
        prepare_data(table, POM_DATA, task, label_kind="scores")
    # clipped on request, said in the log; MA5 for humorous, MA7 for confident
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepared = prepare_data(table, POM_DATA, {**task, "out_of_range": "clip"}, label_kind="scores")
    row = np.flatnonzero((table.arrays["split"] == "test") & (table.arrays["sample_index"] == 2))[0]
    assert prepared.targets[row, 1] == 1.0 and prepared.targets[row, 0] == table.arrays["label"][row, 0]
    assert f"{folder / 'y_test.h5'}: clipped 1 label(s) of humorous into its range [1, 5]" in caplog.text
    import torch

    from polyfuse.metrics.functional import trait_metrics

    targets = torch.from_numpy(prepared.targets)
    keys = trait_metrics(targets, targets, ranges=prepared.label_info["ranges"], names=prepared.label_info["names"])
    assert {"ma7/confident", "ma5/humorous"} <= set(keys)


def test_a_checkpoint_keeps_checking_its_ranges(tmp_path):
    raw = np.array([[2.0], [6.0], [3.0]], dtype=np.float32)
    info = {"names": ["reserved"], "ranges": [[1.0, 5.0]], "columns": [0], "checked": [True]}
    with pytest.raises(ValueError, match=r"^f\.npz row 1: label reserved = 6 lies outside its range \[1, 5\] "
                                         r"\(the checkpoint's range\)"):
        encode_labels(raw, "scores", np.arange(3), {"type": "traits"}, origin="f.npz", label_info=info)
    unchecked = {**info, "checked": [False]}  # a range the training run did not check is not checked either
    labels, _ = encode_labels(raw, "scores", np.arange(3), {"type": "traits"}, origin="f.npz", label_info=unchecked)
    np.testing.assert_array_equal(labels, raw)
