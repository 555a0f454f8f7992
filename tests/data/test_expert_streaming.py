"""Experts read per batch: ``gather`` against the whole-array semantics written out here
with numpy, on both file layouts; the pass at load that refuses partly non-finite arrays
reads the file in bounded chunks."""

import numpy as np
import pytest
import torch

from polyfuse.data.formats import experts as experts_module
from polyfuse.data.formats.experts import ExpertFeatures, load_expert

DIM, T = 3, 6


def _videos(rng):
    """Per-video (T_i, d) arrays: different lengths, one all-NaN (a missing expert)."""
    lengths = {"a": 2, "b": 6, "c": 1, "d": 4, "e": 3}
    arrays = {v: rng.normal(size=(n, DIM)).astype(np.float32) for v, n in lengths.items()}
    arrays["d"][:] = np.nan
    return arrays


def _write_npz(path, arrays):
    """Stacked layout; the steps past each length hold garbage that must never be read."""
    ids = list(arrays)
    stacked = np.full((len(ids), T, DIM), 7.0, dtype=np.float32)
    for i, v in enumerate(ids):
        stacked[i, : len(arrays[v])] = arrays[v]
    np.savez(
        path,
        video_ids=np.array(ids),
        features=stacked,
        lengths=np.array([len(arrays[v]) for v in ids]),
    )


def _write_h5(path, arrays):
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "w") as f:
        for v, a in arrays.items():
            f.create_dataset(f"features/{v}", data=a)


def _oracle(arrays, ids, width=None):
    """The old whole-array view cut to the batch: zeros and False where a video lacks the
    expert (absent from the file, or all NaN), the real steps copied, padded by hand."""
    has = [v in arrays and np.isfinite(arrays[v]).all() for v in ids]
    longest = max([len(arrays[v]) for v, h in zip(ids, has, strict=True) if h] or [1])
    width = longest if width is None else width
    features = np.zeros((len(ids), width, DIM), dtype=np.float32)
    mask = np.zeros((len(ids), width), dtype=bool)
    for i, (v, h) in enumerate(zip(ids, has, strict=True)):
        if h:
            features[i, : len(arrays[v])] = arrays[v]
            mask[i, : len(arrays[v])] = True
    return features, mask, np.array(has)


@pytest.mark.parametrize("layout", ["npz", "h5"])
def test_gather_equals_the_whole_array_view_cut_to_the_batch(tmp_path, layout):
    arrays = _videos(np.random.default_rng(0))
    path = tmp_path / f"face.{layout}"
    (_write_npz if layout == "npz" else _write_h5)(path, arrays)
    wanted = ["e", "zz", "d", "b", "a", "c"]  # zz: not in the file; d: all NaN
    expert = load_expert(path).select(wanted)
    assert expert.present.tolist() == [True, False, False, True, True, True]
    for rows in ([0, 4, 5], [3, 0, 3, 1], [1, 2], [5]):  # repeats, only missing ones, one video
        ids = [wanted[r] for r in rows]
        features, mask, present = expert.gather(rows)
        want = _oracle(arrays, ids)
        assert features.dtype == torch.float32 and mask.dtype == torch.bool
        np.testing.assert_array_equal(features.numpy(), want[0])
        np.testing.assert_array_equal(mask.numpy(), want[1])
        np.testing.assert_array_equal(present.numpy(), want[2])
        padded = expert.gather(
            torch.tensor(rows), expert.steps
        )  # the old T: the longest in the file
        assert expert.steps == T
        np.testing.assert_array_equal(padded[0].numpy(), _oracle(arrays, ids, T)[0])
        np.testing.assert_array_equal(padded[1].numpy(), _oracle(arrays, ids, T)[1])


@pytest.mark.parametrize("layout", ["npz", "h5"])
def test_a_partly_non_finite_video_is_refused_naming_the_file_and_the_video(tmp_path, layout):
    arrays = _videos(np.random.default_rng(1))
    arrays["b"][3, 1] = np.inf
    path = tmp_path / f"audio.{layout}"
    (_write_npz if layout == "npz" else _write_h5)(path, arrays)
    with pytest.raises(
        ValueError, match=r"audio\.(npz|h5).*video 'b' has some non-finite values in expert 'audio'"
    ) as error:
        load_expert(path)
    assert "\n" not in str(error.value)


def test_the_pass_at_load_reads_the_file_a_bounded_chunk_at_a_time(tmp_path, monkeypatch):
    from polyfuse.data.sequences import SequenceFile

    arrays = _videos(np.random.default_rng(2))
    _write_npz(tmp_path / "e.npz", arrays)
    asked = []
    read = SequenceFile.read
    monkeypatch.setattr(
        SequenceFile, "read", lambda self, rows: asked.append(list(rows)) or read(self, rows)
    )
    monkeypatch.setattr(experts_module, "SCAN_BYTES", 2 * T * DIM * 4)  # two videos of the longest
    load_expert(tmp_path / "e.npz")
    assert asked == [[0, 1], [2, 3], [4]]


def test_experts_held_in_memory_gather_like_the_file_ones():
    features = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    features = features * mask.unsqueeze(-1)
    present = torch.tensor([True, True, False])
    expert = ExpertFeatures("x", ["p", "q", "r"], features, mask, present)
    got, got_mask, got_present = expert.gather([2, 0])
    assert got_present.tolist() == [False, True]
    assert torch.equal(got, torch.stack([torch.zeros(2, 2), features[0, :2]]))
    assert got_mask.tolist() == [[False, False], [True, True]]
    assert torch.equal(expert.gather([1], 4)[0], features[1:2])
    with pytest.raises(ValueError, match="prefix"):
        ExpertFeatures(
            "x",
            ["p"],
            torch.zeros(1, 3, 2),
            torch.tensor([[True, False, True]]),
            torch.tensor([True]),
        )
