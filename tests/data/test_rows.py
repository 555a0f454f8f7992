"""Feature files read a few rows at a time (polyfuse.data.rows): the rows numpy's own
indexing gives, memory maps for stored npz arrays, refusals naming the file."""

import pickle

import h5py
import numpy as np
import pytest

from polyfuse.data import rows as rows_module
from polyfuse.data.rows import H5File, npz_member, npz_members, read_rows


@pytest.mark.parametrize("wanted", [[5, 1, 1, 49], [3, 4, 3], [7], [], [0, 49]])
def test_read_rows_gives_numpy_fancy_indexing_from_hdf5(tmp_path, wanted):
    values = np.random.default_rng(0).normal(size=(50, 3, 2)).astype(np.float32)
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle["x"] = values
    file = H5File(tmp_path / "f.h5")
    np.testing.assert_array_equal(file.read("x", wanted), values[wanted])
    np.testing.assert_array_equal(read_rows(values, wanted), values[wanted])
    copy = pickle.loads(pickle.dumps(file))  # as a spawned loader worker gets it
    np.testing.assert_array_equal(copy.read("x", wanted), values[wanted])
    with pytest.raises(IndexError, match=r"rows 0\.\.50 outside the 50 rows"):
        read_rows(values, [0, 50])
    with pytest.raises(ValueError, match=r"f\.h5: no dataset 'y' \(found \['x'\]\)"):
        file.read("y", [0])


def test_a_truncated_hdf5_file_is_named_when_its_rows_are_read(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=np.ones((4000, 64), dtype=np.float32), chunks=(100, 64))
    file = H5File(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"f\.h5: cannot read"):
        file.read("x", [3999])


def test_npz_members_are_memory_maps_when_stored(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(5, 4, 3)
    b = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    np.savez(tmp_path / "u.npz", a=a, b=b, ids=np.array(["x", "y"]))
    assert {name: m.offset is not None for name, m in npz_members(tmp_path / "u.npz").items()} == {
        "a": True, "b": True, "ids": True}
    mapped = npz_member(tmp_path / "u.npz", "a")
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    np.testing.assert_array_equal(mapped, a)
    np.testing.assert_array_equal(npz_member(tmp_path / "u.npz", "b"), b)
    assert npz_member(tmp_path / "u.npz", "ids").tolist() == ["x", "y"]
    with pytest.raises(ValueError, match=r"u\.npz: no array 'c'"):
        npz_member(tmp_path / "u.npz", "c")


def test_compressed_npz_arrays_are_read_whole_up_to_the_bound(tmp_path, monkeypatch):
    a = np.arange(1000, dtype=np.float32)
    np.savez_compressed(tmp_path / "c.npz", a=a)
    read = npz_member(tmp_path / "c.npz", "a")
    assert not isinstance(read, np.memmap)
    np.testing.assert_array_equal(read, a)
    monkeypatch.setattr(rows_module, "MAX_COMPRESSED_BYTES", 3999)
    with pytest.raises(ValueError, match=r"c\.npz: array 'a' is compressed and takes 4000 bytes, over the 3999 "
                                         r"bytes read whole .* np\.savez\(sys\.argv\[2\]"):
        npz_member(tmp_path / "c.npz", "a")


def test_a_truncated_or_pickled_npz_is_refused_naming_it(tmp_path):
    np.savez(tmp_path / "u.npz", a=np.ones((100, 100), dtype=np.float32))
    data = (tmp_path / "u.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.npz: cannot read as \.npz"):
        npz_member(tmp_path / "t.npz", "a")
    np.savez(tmp_path / "p.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"p\.npz: array 'a' holds objects \(pickles\)"):
        npz_member(tmp_path / "p.npz", "a")
