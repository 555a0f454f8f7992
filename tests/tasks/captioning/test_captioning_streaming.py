"""Captioning batches read from the feature files per batch: the values the whole-array
code gave (padded with zeros to the batch's longest video, strided, standardised with the
training steps' float32 mean and unbiased std), the same with loader workers, the
streamed statistics, and NaN found in a batch mid-epoch named by file and video."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from polyfuse.tasks.captioning import data as captioning_data
from polyfuse.tasks.captioning.data import CaptioningDataModule, prepare_captioning

STEPS = {"t0": 7, "t1": 3, "t2": 9, "t3": 5, "t4": 6, "v0": 4, "v1": 8, "s0": 2, "s1": 6}
SPLITS = {"train": ["t0", "t1", "t2", "t3", "t4"], "val": ["v0", "v1"], "test": ["s0", "s1"]}


def _write(tmp: Path, nan_video: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Two modalities (a stored npz keyed by id, an HDF5 group per id), captions and
    splits; returns the arrays written, the oracle's input."""
    rng = np.random.default_rng(1)
    written = {
        "app": {v: (rng.normal(size=(t, 3)) * 4 + 2).astype(np.float32) for v, t in STEPS.items()},
        "mot": {v: rng.gamma(2.0, size=(t + 1, 2)).astype(np.float32) for v, t in STEPS.items()},
    }
    if nan_video is not None:
        written["mot"][nan_video][1, 0] = np.nan
    np.savez(tmp / "app.npz", **written["app"])
    with h5py.File(tmp / "mot.h5", "w") as handle:
        for video, array in written["mot"].items():
            handle.create_dataset(f"motion/{video}", data=array)
    captions = {v: [f"a clip number {i}", "something happens"] for i, v in enumerate(STEPS)}
    (tmp / "captions.json").write_text(json.dumps(captions))
    (tmp / "splits.json").write_text(json.dumps(SPLITS))
    return written


def _prepare(tmp: Path, **options):
    return prepare_captioning(
        {"app": "app.npz", "mot": "mot.h5#motion"},
        "captions.json",
        "splits.json",
        base=tmp,
        frame_stride=2,
        **options,
    )


def _oracle(written: dict[str, dict[str, np.ndarray]], videos: list[str], rows: list[int]):
    """The batch of ``rows`` as the whole-array code made it: every video strided and
    padded into one (N, T_max, d) float32 tensor, standardised over the real training
    steps (float32 mean, unbiased std at least 1e-6), then cut to the batch's longest."""
    inputs, masks = [], []
    for arrays in written.values():
        strided = [arrays[v][::2] for v in videos]
        lengths = torch.tensor([len(a) for a in strided])
        whole = torch.zeros(len(videos), int(lengths.max()), strided[0].shape[1])
        for i, array in enumerate(strided):
            whole[i, : len(array)] = torch.from_numpy(array)
        real = torch.arange(whole.shape[1]) < lengths[:, None]
        train = torch.arange(len(SPLITS["train"]))
        values = whole[train][real[train]]
        mean, std = values.mean(dim=0), values.std(dim=0).clamp_min(1e-6)
        whole = ((whole - mean) / std) * real.unsqueeze(-1)
        steps = int(lengths[rows].max())
        inputs.append(whole[rows, :steps])
        masks.append(real[rows, :steps])
    return inputs, masks


def test_batches_equal_the_whole_array_values(tmp_path: Path) -> None:
    written = _write(tmp_path)
    data = _prepare(tmp_path)
    assert data.videos == [v for split in ("train", "val", "test") for v in SPLITS[split]]
    assert data.input_dims == [3, 2] and data.max_lengths == [5, 5]  # ceil(9 / 2), ceil(10 / 2)
    for rows in ([0, 1], [3, 3, 6, 2], [7, 8], list(range(9))):
        inputs, masks = data.gather(torch.tensor(rows))
        expected_inputs, expected_masks = _oracle(written, data.videos, rows)
        for got, want in zip(inputs + masks, expected_inputs + expected_masks, strict=True):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(got, want), rows
        assert all(float(x[~m].abs().sum()) == 0.0 for x, m in zip(inputs, masks, strict=True))
    # standardised on the training steps: their mean is 0, their std 1
    inputs, masks = data.gather(torch.arange(5))
    steps = inputs[0][masks[0]].double()
    np.testing.assert_allclose(steps.mean(0).numpy(), 0.0, atol=1e-6)
    np.testing.assert_allclose(steps.std(0).numpy(), 1.0, atol=1e-6)


def test_loader_batches_are_the_same_with_workers(tmp_path: Path) -> None:
    _write(tmp_path)
    data = _prepare(tmp_path)
    plain = CaptioningDataModule(data, batch_size=4, eval_batch_size=3, seed=5)
    workers = CaptioningDataModule(
        data,
        batch_size=4,
        eval_batch_size=3,
        seed=5,
        loader={
            "num_workers": 2,
            "prefetch_factor": 2,
            "persistent_workers": False,
            "pin_memory": False,
        },
    )
    for one, two in (
        (plain.train_dataloader(), workers.train_dataloader()),
        (plain.loader("all"), workers.loader("all")),
    ):
        batches = list(zip(one, two, strict=True))
        assert len(batches) > 1
        for a, b in batches:
            assert a["videos"] == b["videos"]
            for x, y in zip(a["inputs"] + a["masks"], b["inputs"] + b["masks"], strict=True):
                assert torch.equal(x, y)


def test_streamed_statistics_agree_with_float64(tmp_path: Path, monkeypatch) -> None:
    written = _write(tmp_path)
    exact = _prepare(tmp_path).statistics
    monkeypatch.setattr(captioning_data, "EXACT_STATISTICS_BYTES", 0)
    monkeypatch.setattr(
        "polyfuse.data.formats.captioning.CHUNK_BYTES", 40
    )  # a few videos per chunk
    streamed = _prepare(tmp_path).statistics
    for (mean, std), (exact_mean, exact_std), arrays in zip(
        streamed, exact, written.values(), strict=True
    ):
        steps = np.concatenate([arrays[v][::2] for v in SPLITS["train"]]).astype(np.float64)
        np.testing.assert_allclose(mean.numpy(), steps.mean(0), rtol=1e-6)
        np.testing.assert_allclose(std.numpy(), steps.std(0, ddof=1), rtol=1e-6)
        np.testing.assert_allclose(mean.numpy(), exact_mean.numpy(), rtol=1e-5)
        np.testing.assert_allclose(std.numpy(), exact_std.numpy(), rtol=1e-5)


def test_nan_found_in_a_batch_mid_epoch_names_the_file_and_video(tmp_path: Path) -> None:
    _write(tmp_path, nan_video="v1")
    data = _prepare(tmp_path)  # a validation video: not read at preparation
    batches = iter(
        CaptioningDataModule(data, batch_size=2, eval_batch_size=1, seed=0).val_dataloader()
    )
    next(batches)  # v0's captions
    next(batches)
    with pytest.raises(ValueError) as error:
        next(batches)  # v1
    assert str(error.value) == f"{tmp_path / 'mot.h5'}#motion: video 'v1' has NaN or Inf features"
    _write(tmp_path, nan_video="t2")  # a training video: refused when the statistics read it
    with pytest.raises(ValueError, match=r"mot.h5#motion: video 't2' has NaN or Inf features$"):
        _prepare(tmp_path)
