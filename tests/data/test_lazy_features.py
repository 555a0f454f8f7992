"""Features of .npz / .h5 files are read a batch of rows at a time: the batches equal
a whole-array preparation written here in plain numpy (the oracle) on every
data.padding / data.nonfinite / data.standardize mode, a batch reads its rows and not
the array, and a non-finite value found while batching names the file, array and row."""

import re
import tracemalloc

import h5py
import numpy as np
import pytest
import torch
from tests.tiny.synthetic import engine_config

from polyfuse.data import load_source, prepare_data
from polyfuse.data import prepare as prepare_module
from polyfuse.data.arrays import ArrayTable, H5Arrays, NpzArrays
from polyfuse.data.datamodule import FusionDataModule
from polyfuse.data.rows import H5File, npz_member
from polyfuse.engine import resolve_config
from polyfuse.tasks.registry import task_spec

N, T, D = 48, 6, 4
TASK = {"type": "sentiment"}


def raw_arrays(padding: str, nonfinite: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """A sequence modality ``x`` (zero padded left / right, or real steps first with
    ``x_lengths`` and garbage in the padding), a vector modality ``v``, labels, splits;
    with ``nonfinite`` NaN and Inf at real steps."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, N)
    lengths[:3] = [T, 0, 1]
    values = rng.normal(3.0, 2.0, (N, T, D)).astype(np.float32)
    x = np.zeros((N, T, D), dtype=np.float32)
    for row, length in enumerate(lengths):
        if padding == "left":
            x[row, T - length :] = values[row, :length]
        else:
            x[row, :length] = values[row, :length]
    raw = {"v": rng.normal(-1.0, 5.0, (N, 3)).astype(np.float64)}
    raw["v"][:, 2] = 7.0  # a constant feature: std 1, never a division by zero
    if padding == "auto":
        x[np.arange(T)[None, :] >= lengths[:, None]] = 99.0  # padding content must never matter
        x[1, 0, 0] = np.nan  # in the padding (length 0): ignored
        raw["x_lengths"] = lengths
    else:
        x[0, 2] = 0.0  # a zero step between real ones stays
    if nonfinite:
        x[0, 1, 1] = np.nan
        x[0, 3, 2] = np.inf
        raw["v"][5, 0] = np.nan
    raw["x"] = x
    raw["label"] = rng.uniform(-3, 3, N).astype(np.float32)
    raw["split"] = np.array(["train"] * 32 + ["test"] * 16)
    return raw


def oracle(raw: np.ndarray, lengths: np.ndarray | None, train: np.ndarray, padding: str, nonfinite: str,
           standardize: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prepared (N, T, d) array and (N,) lengths of one modality, and the training
    mean, from the rules of docs/TRAINING.md (every row used)."""
    x = raw.astype(np.float32)
    x = x[:, None, :] if x.ndim == 2 else x
    count, steps, _ = x.shape
    if padding == "auto":
        lengths = np.full(count, steps) if lengths is None else lengths
    else:  # real steps: those not all zero; left padding: move them to the front
        real = (x != 0).any(axis=-1)
        first = np.array([np.flatnonzero(r)[0] if r.any() else steps for r in real])
        last = np.array([np.flatnonzero(r)[-1] + 1 if r.any() else 0 for r in real])
        if padding == "left":
            lengths = steps - first
            x = np.stack([np.concatenate([x[i, first[i] :], np.zeros_like(x[i, : first[i]])]) for i in range(count)])
        else:
            lengths = last
    real = np.arange(steps)[None, :] < lengths[:, None]
    bad = ~np.isfinite(x) & real[:, :, None]
    x = x.copy()
    x[bad] = 0.0 if nonfinite == "zero" else np.nan
    observed = x[train][real[train]].astype(np.float64)
    mean = np.array([np.mean(c[np.isfinite(c)]) if np.isfinite(c).any() else 0.0 for c in observed.T])
    std = np.array([np.std(c[np.isfinite(c)]) if np.isfinite(c).any() else 0.0 for c in observed.T])
    std[std < 1e-8 * np.maximum(1.0, np.abs(mean))] = 1.0
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    out = (x - mean) / std if standardize else x
    out = np.where(np.isnan(out), 0.0 if standardize else mean, out)
    return np.where(real[:, :, None], out, 0.0).astype(np.float32), lengths, mean


def save(raw: dict[str, np.ndarray], path) -> str:
    if str(path).endswith(".npz"):
        np.savez(path, **raw)
    else:
        with h5py.File(path, "w") as handle:
            for key, value in raw.items():
                handle[key] = value.astype("S") if value.dtype.kind == "U" else value
    return str(path)


def config(padding: str, nonfinite: str = "error", standardize: bool = True) -> dict:
    return {"modalities": ["x", "v"], "split": "split", "validation_fraction": 0.25, "padding": padding,
            "nonfinite": nonfinite, "standardize": standardize}


def batches(data, key: str = "test", batch_size: int = 5, **options) -> list[dict]:
    return list(FusionDataModule(data, batch_size=8, eval_batch_size=batch_size, loader_options=options).loader(key))


@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("nonfinite", ["error", "zero", "mean"])
@pytest.mark.parametrize("padding", ["auto", "left", "right"])
def test_batches_from_files_equal_the_whole_array_preparation(tmp_path, padding, nonfinite, standardize):
    raw = raw_arrays(padding, nonfinite != "error")
    settings = config(padding, nonfinite, standardize)
    memory = prepare_data(ArrayTable("memory", dict(raw)), settings, TASK, label_kind="score")
    train = memory.splits["train"].rows
    for suffix in ("npz", "h5"):
        data = prepare_data(load_source(save(raw, tmp_path / f"f.{suffix}")), settings, TASK, label_kind="score")
        for j, name in enumerate(["x", "v"]):
            expected, lengths, mean = oracle(raw[name], raw.get(f"{name}_lengths"), train, padding, nonfinite, standardize)
            np.testing.assert_array_equal(data.lengths[j], lengths)
            np.testing.assert_allclose(data.stats[name].mean, mean, rtol=1e-6)
            np.testing.assert_allclose(np.asarray(data.features[j]), expected, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(np.asarray(data.features[j]), np.asarray(memory.features[j]))
        rows = []
        for batch in batches(data):
            rows.append(batch["row"].numpy())
            for j, name in enumerate(["x", "v"]):
                expected, lengths, _ = oracle(raw[name], raw.get(f"{name}_lengths"), train, padding, nonfinite, standardize)
                steps = max(1, int(lengths[rows[-1]].max()))
                np.testing.assert_allclose(batch["inputs"][j].numpy(), expected[rows[-1], :steps], rtol=1e-5, atol=1e-5)
                np.testing.assert_array_equal(batch["masks"][j].numpy(), np.arange(steps) < lengths[rows[-1], None])
        np.testing.assert_array_equal(np.concatenate(rows), data.splits["test"].rows)


@pytest.mark.parametrize(("padding", "nonfinite"), [("auto", "mean"), ("left", "zero"), ("right", "mean")])
def test_statistics_streamed_over_blocks_match_one_array(tmp_path, monkeypatch, padding, nonfinite):
    raw = raw_arrays(padding, True)
    path = save(raw, tmp_path / "f.npz")
    exact = prepare_data(load_source(path), config(padding, nonfinite), TASK, label_kind="score")
    monkeypatch.setattr(prepare_module, "EXACT_STATS_BYTES", 0)  # always streamed, 3 rows a block
    monkeypatch.setattr(prepare_module, "BLOCK_BYTES", 3 * T * D * 4)
    streamed = prepare_data(load_source(path), config(padding, nonfinite), TASK, label_kind="score")
    train = exact.splits["train"].rows
    for j, name in enumerate(["x", "v"]):
        _, _, mean = oracle(raw[name], raw.get(f"{name}_lengths"), train, padding, nonfinite, True)
        np.testing.assert_allclose(streamed.stats[name].mean, mean, rtol=1e-6)
        np.testing.assert_allclose(streamed.stats[name].std, exact.stats[name].std, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(streamed.features[j]), np.asarray(exact.features[j]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("suffix", ["npz", "h5"])
def test_the_preparation_pass_names_the_first_nonfinite_value(tmp_path, suffix):
    path = save(raw_arrays("auto", True), tmp_path / f"f.{suffix}")
    message = rf"{re.escape(path)}: modality 'x' has NaN at row 0 \(step 1, feature 1\) \(and 1 more\)"
    with pytest.raises(ValueError, match=message):
        prepare_data(load_source(path), config("auto"), TASK, label_kind="score")


def test_a_nan_found_while_batching_names_file_array_and_row(tmp_path):
    raw = raw_arrays("auto", False)
    path = save(raw, tmp_path / "f.npz")
    data = prepare_data(load_source(path), config("auto"), TASK, label_kind="score")
    module = FusionDataModule(data, batch_size=8)
    assert len(list(module.train_dataloader())) == 3  # clean so far
    member = npz_member(path, "x")  # the file changes after it was checked: a NaN mid-epoch
    changed = np.memmap(path, dtype=member.dtype, mode="r+", offset=member.offset, shape=member.shape)
    row = int(next(r for r in data.splits["train"].rows[12:] if raw["x_lengths"][r] > 0))
    step = int(raw["x_lengths"][row]) - 1  # its last real step
    changed[row, step, 3] = np.nan
    changed.flush()
    del changed
    message = rf"{re.escape(path)}: modality 'x' has NaN at row {row} \(step {step}, feature 3\);"
    with pytest.raises(ValueError, match=message):
        list(module.train_dataloader())


@pytest.mark.parametrize("suffix", ["npz", "h5"])
def test_a_batch_reads_its_rows_not_the_array(tmp_path, monkeypatch, suffix):
    count, steps, size = 4000, 16, 64  # 16 MiB of features
    rng = np.random.default_rng(1)
    raw = {"x": rng.standard_normal((count, steps, size), dtype=np.float32),
           "label": rng.normal(size=count).astype(np.float32),
           "split": np.where(np.arange(count) < 3000, "train", "test")}
    path = save(raw, tmp_path / f"big.{suffix}")
    size_of_x = raw["x"].nbytes
    del raw
    monkeypatch.setattr(prepare_module, "BLOCK_BYTES", 1 << 18)
    monkeypatch.setattr(prepare_module, "EXACT_STATS_BYTES", 1 << 18)
    for reader in (NpzArrays, H5Arrays):  # labels and splits are read whole, features never
        whole = reader.__getitem__
        monkeypatch.setattr(reader, "__getitem__", lambda self, name, whole=whole: whole(self, name) if name != "x"
                            else pytest.fail("the features were read whole"))
    reads = []
    read = H5File.read
    monkeypatch.setattr(H5File, "read", lambda self, name, rows: reads.append(len(rows)) or read(self, name, rows))
    tracemalloc.start()
    try:
        data = prepare_data(load_source(path), {"modalities": ["x"], "split": "split"}, TASK, label_kind="score")
        reads.clear()
        batch = next(iter(FusionDataModule(data, batch_size=16).train_dataloader()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert batch["inputs"][0].shape == (16, steps, size)
    assert peak < size_of_x / 4, f"peak {peak} bytes for a {size_of_x}-byte array"
    if suffix == "h5":
        assert reads == [16]


def test_contextual_windows_gather_the_prepared_rows(tmp_path):
    rng = np.random.default_rng(2)
    count = 60
    raw = {"a": rng.normal(2.0, 3.0, (count, 3)).astype(np.float32), "label": rng.uniform(-3, 3, count).astype(np.float32),
           "video": np.repeat(np.arange(6), 10).astype(str), "start": rng.permutation(count).astype(np.float32),
           "split": np.array(["train"] * 40 + ["test"] * 20)}
    settings = {"modalities": ["a"], "split": "split", "validation_fraction": 0.25,
                "context": {"group_by": "video", "order_by": "start", "window": 4}}
    data = prepare_data(load_source(save(raw, tmp_path / "ctx.h5")), settings, TASK, label_kind="score")
    expected, _, _ = oracle(raw["a"], None, data.splits["train"].rows, "auto", "error", True)
    split = data.splits["test"]
    seen = 0
    for batch in batches(data, "test", batch_size=7):
        windows = split.windows[seen : seen + len(batch["row"])]
        steps = int((windows >= 0).sum(axis=1).max())
        windows = windows[:, :steps]
        gathered = expected[np.clip(windows, 0, None), 0] * (windows >= 0)[:, :, None]
        np.testing.assert_allclose(batch["inputs"][0].numpy(), gathered, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(batch["masks"][0].numpy(), windows >= 0)
        seen += len(batch["row"])
    assert seen == len(split)


def test_workers_give_the_same_batches(tmp_path):
    raw = raw_arrays("right", True)
    data = prepare_data(load_source(save(raw, tmp_path / "f.h5")), config("right", "mean"), TASK, label_kind="score")
    module = FusionDataModule(data, batch_size=8)
    alone = list(module.train_dataloader())
    workers = list(FusionDataModule(data, batch_size=8, loader_options={"num_workers": 2}).train_dataloader())
    assert len(alone) == len(workers) == 3
    for a, b in zip(alone, workers, strict=True):
        assert torch.equal(a["row"], b["row"]) and torch.equal(a["target"], b["target"])
        for x, y in zip(a["inputs"] + a["masks"], b["inputs"] + b["masks"], strict=True):
            assert torch.equal(x, y)


def test_the_tabular_task_passes_the_loader_options(tmp_path):
    resolved = resolve_config(engine_config(tmp_path, data={"loader_workers": 1}))
    datamodule = task_spec(resolved["task"]["type"]).build_data(resolved).datamodule
    loader = datamodule.train_dataloader()
    assert loader.num_workers == 1 and loader.prefetch_factor == 2
