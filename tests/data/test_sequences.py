"""Per-id feature sequences read on demand (polyfuse.data.sequences): every layout gives
the values numpy and h5py read whole, stored npz arrays are memory maps (reading a row
does not load the others), big compressed arrays are refused with the conversion
command, a SequenceFile pickles without its data."""

import pickle
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

from polyfuse.data.sequences import open_sequences

RNG = np.random.default_rng(0)
LENGTHS = {"v0": 3, "v1": 1, "v2": 5, "v3": 2}
D = 4


def _per_id() -> dict[str, np.ndarray]:
    arrays = {v: RNG.normal(size=(t, D)).astype(np.float32) for v, t in LENGTHS.items()}
    arrays["v1"] = arrays["v1"][0]  # a (d,) array: one step
    return arrays


def _stacked() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array(list(LENGTHS))
    values = RNG.normal(size=(len(ids), 5, D)).astype(np.float16)
    return ids, values, np.array(list(LENGTHS.values()))


def _expect_per_id(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {v: np.asarray(a, dtype=np.float32).reshape(-1, D) for v, a in arrays.items()}


def _layouts(tmp: Path) -> list[tuple[str, str | None, dict[str, np.ndarray]]]:
    """(file, key, expected {id: (T, d) float32}) of every layout, the oracle read by
    numpy and h5py straight from what was written."""
    out = []
    arrays = _per_id()
    np.savez(tmp / "keyed.npz", **arrays)
    np.savez_compressed(tmp / "keyed_packed.npz", **arrays)
    with np.load(tmp / "keyed.npz") as stored:
        expected = _expect_per_id({v: stored[v] for v in stored.files})
    out += [(tmp / "keyed.npz", None, expected), (tmp / "keyed_packed.npz", None, expected)]
    with h5py.File(tmp / "per_id.h5", "w") as handle:
        for video, array in arrays.items():
            handle.create_dataset(f"motion/{video}", data=array)
            handle.create_dataset(video, data=array * 2)
    with h5py.File(tmp / "per_id.h5") as handle:
        out.append(
            (
                tmp / "per_id.h5",
                "motion",
                _expect_per_id({v: handle["motion"][v][()] for v in LENGTHS}),
            )
        )
        out.append((tmp / "per_id.h5", None, _expect_per_id({v: handle[v][()] for v in LENGTHS})))
    ids, values, lengths = _stacked()
    np.savez(tmp / "stacked.npz", video_ids=ids, vgg=values, lengths=lengths)
    np.savez_compressed(tmp / "stacked_packed.npz", video_ids=ids, vgg=values, lengths=lengths)
    with np.load(tmp / "stacked.npz") as stored:
        expected = {
            str(v): stored["vgg"][i, : stored["lengths"][i]].astype(np.float32)
            for i, v in enumerate(stored["video_ids"])
        }
    out += [(tmp / "stacked.npz", "vgg", expected), (tmp / "stacked_packed.npz", None, expected)]
    np.savez(tmp / "vectors.npz", video_ids=ids, features=values[:, 0])  # (N, d): one step each
    out.append(
        (
            tmp / "vectors.npz",
            "features",
            {str(v): values[i, :1].astype(np.float32) for i, v in enumerate(ids)},
        )
    )
    with h5py.File(tmp / "stacked.h5", "w") as handle:
        handle.create_dataset("video_ids", data=ids.astype("S"))
        handle.create_dataset("vgg", data=values)
        handle.create_dataset("lengths", data=lengths)
        group = handle.create_group("clip")
        group.create_dataset("video_ids", data=ids.astype("S"))
        group.create_dataset("values", data=values[:, :2] * 3)
    with h5py.File(tmp / "stacked.h5") as handle:
        out.append(
            (
                tmp / "stacked.h5",
                "vgg",
                {
                    v: handle["vgg"][i, : handle["lengths"][i]].astype(np.float32)
                    for i, v in enumerate(LENGTHS)
                },
            )
        )
        out.append(
            (
                tmp / "stacked.h5",
                "clip",
                {v: handle["clip/values"][i].astype(np.float32) for i, v in enumerate(LENGTHS)},
            )
        )
    return out


def test_every_layout_reads_the_values_numpy_and_h5py_read_whole(tmp_path: Path) -> None:
    for path, key, expected in _layouts(tmp_path):
        sequences = open_sequences(path, key)
        assert sequences.ids == list(expected), path
        assert sequences.lengths.tolist() == [a.shape[0] for a in expected.values()], path
        assert sequences.lengths.dtype == np.int64 and sequences.dim == D
        assert sequences.where == f"{path}{'#' + key if key else ''}"
        rows = [2, 0, 2, 3, 1]  # any order, repeats
        for row, array in zip(rows, sequences.read(rows), strict=True):
            video = sequences.ids[row]
            assert sequences.row_of(video) == row
            assert array.dtype == np.float32 and array.flags.writeable
            np.testing.assert_array_equal(array, expected[video], err_msg=f"{path}#{key} {video}")
        again = pickle.loads(pickle.dumps(sequences))  # as a spawned loader worker gets it
        np.testing.assert_array_equal(again.read([3])[0], expected[sequences.ids[3]])


def test_stored_npz_arrays_are_memory_maps_and_pickle_without_their_data(tmp_path: Path) -> None:
    big = np.ones((4000, 1000), np.float32)  # 16 MB
    np.savez(tmp_path / "keyed.npz", big=big, small=np.full((2, 1000), 7, np.float32))
    np.savez(tmp_path / "stacked.npz", video_ids=np.array(["a", "b"]), x=np.stack([big, big]))
    for path, row in ((tmp_path / "keyed.npz", 1), (tmp_path / "stacked.npz", 1)):
        tracemalloc.start()
        try:
            sequences = open_sequences(path)
            value = sequences.read([row])[0]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert value.shape[0] in (2, 4000)
        # opening reads headers only; the row read is a copy of that row, nothing else
        assert peak < value.nbytes + (2 << 20), (path, peak)
        assert len(pickle.dumps(sequences)) < 64 << 10
    keyed = open_sequences(tmp_path / "keyed.npz")
    assert isinstance(keyed._reader.view(0), np.memmap)


def test_a_big_compressed_array_is_refused_with_the_conversion_command(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("polyfuse.data.rows.MAX_COMPRESSED_BYTES", 100)
    np.savez_compressed(
        tmp_path / "stacked.npz", video_ids=np.array(["a"]), x=np.zeros((1, 10, 4), np.float32)
    )
    np.savez_compressed(tmp_path / "keyed.npz", a=np.zeros((10, 4), np.float32))
    for path, name in ((tmp_path / "stacked.npz", "x"), (tmp_path / "keyed.npz", "a")):
        with pytest.raises(
            ValueError,
            match=rf"{path}: array '{name}' is compressed and takes 160 bytes.*"
            r"rewrite the file uncompressed.*np\.savez\(",
        ) as error:
            open_sequences(path)
        assert "\n" not in str(error.value)
    np.savez(
        tmp_path / "plain.npz", a=np.zeros((10, 4), np.float32)
    )  # stored: read in rows, never refused
    assert open_sequences(tmp_path / "plain.npz").lengths.tolist() == [10]


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (
            {"video_ids": np.array(["a", "a"]), "x": np.zeros((2, 3, 4))},
            r"#x: duplicate video id 'a'",
        ),
        ({"video_ids": np.array(["a", ""]), "x": np.zeros((2, 3, 4))}, r"#x: an empty video id"),
        (
            {
                "video_ids": np.array(["a", "b"]),
                "x": np.zeros((2, 3, 4)),
                "lengths": np.array([3, 0]),
            },
            r"lengths disagree with the features \(T = 3\) for video 'b' \(length 0; 1 such videos\)",
        ),
        (
            {
                "video_ids": np.array(["a", "b"]),
                "x": np.zeros((2, 3, 4)),
                "lengths": np.array([1.5, 2]),
            },
            r"lengths must be whole numbers",
        ),
        (
            {"video_ids": np.array(["a"]), "x": np.zeros((1, 3, 4, 5))},
            r"expected an \(N, T, d\) or \(N, d\) array",
        ),
        (
            {"video_ids": np.array(["a"]), "x": np.array([["s"]])},
            r"array 'x' holds <U1 values, not numbers",
        ),
    ],
)
def test_bad_stacked_files_name_the_file_and_the_video(tmp_path: Path, arrays, message) -> None:
    np.savez(tmp_path / "f.npz", **arrays)
    with pytest.raises(
        ValueError, match=rf"{tmp_path / 'f.npz'}{message}" if message.startswith("#") else message
    ):
        open_sequences(tmp_path / "f.npz", "x")


def test_bad_per_id_files_name_the_file_and_the_video(tmp_path: Path) -> None:
    np.savez(tmp_path / "cube.npz", a=np.zeros((2, 3)), b=np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"cube.npz: video 'b' has features of shape \(2, 3, 4\)"):
        open_sequences(tmp_path / "cube.npz")
    np.savez(tmp_path / "good.npz", a=np.zeros((2, 3)))
    with h5py.File(tmp_path / "dims.h5", "w") as handle:
        handle["g/a"], handle["g/b"] = np.zeros((2, 3)), np.zeros((1, 5))
    with pytest.raises(
        ValueError,
        match=r"dims.h5#g: feature sizes disagree: video 'a' has d = 3, video 'b' has d = 5",
    ):
        open_sequences(tmp_path / "dims.h5", "g")
    with pytest.raises(ValueError, match=r"keyed by video id"):
        open_sequences(tmp_path / "cube.npz", "a")
    with pytest.raises(ValueError, match=r"no features for video 'zz'"):
        open_sequences(tmp_path / "good.npz").row_of("zz")
