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
    assert file.read("x", wanted).dtype == read_rows(values, wanted).dtype == np.float32
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


def test_every_member_of_an_npz_is_listed_whatever_comes_before_it(tmp_path):
    import zipfile

    a, b = np.arange(6, dtype=np.float32), np.arange(4, dtype=np.int64).reshape(2, 2)
    np.savez_compressed(tmp_path / "c.npz", a=a, b=b)  # a compressed member before another
    np.testing.assert_array_equal(npz_member(tmp_path / "c.npz", "b"), b)
    path = tmp_path / "mixed.npz"
    with zipfile.ZipFile(path, "w") as archive:  # a file that is not an array, then a stored and a compressed one
        archive.writestr("README.txt", "not an array")
        for name, value, kind in (("a", a, zipfile.ZIP_STORED), ("b", b, zipfile.ZIP_DEFLATED)):
            info = zipfile.ZipInfo(f"{name}.npy")
            info.compress_type = kind
            with archive.open(info, "w") as member:
                np.lib.format.write_array(member, value, version=(2, 0))  # the npy header of version 2.0
    members = npz_members(path)
    assert sorted(members) == ["a", "b"] and members["a"].shape == (6,) and members["b"].shape == (2, 2)
    assert members["a"].dtype == np.float32 and not members["a"].fortran
    np.testing.assert_array_equal(npz_member(path, "a"), a)
    np.testing.assert_array_equal(npz_member(path, "b"), b)


def test_an_unknown_npy_version_and_a_missing_file_are_named(tmp_path):
    import zipfile

    path = tmp_path / "v3.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", b"\x93NUMPY\x03\x00" + b"\x00" * 64)
    with pytest.raises(ValueError, match=r"v3\.npz: array 'a' has a broken header: npy format version \(3, 0\) is not "
                                         r"supported"):
        npz_member(path, "a")
    with pytest.raises(FileNotFoundError, match=r"feature file .*nope\.h5 does not exist"):
        H5File(tmp_path / "nope.h5")
    with h5py.File(tmp_path / "g.h5", "w") as handle:
        handle["group/x"] = np.zeros((3, 2))
        handle["y"] = np.zeros(5)
    assert H5File(tmp_path / "g.h5").shapes == {"group/x": (3, 2), "y": (5,)}


def test_npz_arrays_of_one_row_none_or_no_shape_and_a_header_past_the_end(tmp_path):
    one, none, scalar = np.arange(1, 4, dtype=np.float32)[None], np.zeros((0, 3)), np.array(7.5)
    np.savez(tmp_path / "s.npz", one=one, none=none, scalar=scalar)
    np.testing.assert_array_equal(npz_member(tmp_path / "s.npz", "one"), one)
    assert npz_member(tmp_path / "s.npz", "none").shape == (0, 3)
    assert npz_member(tmp_path / "s.npz", "scalar") == 7.5
    np.savez(tmp_path / "big.npz", a=np.zeros(100000))
    data = (tmp_path / "big.npz").read_bytes()
    assert data.count(b"(100000,)") == 1
    (tmp_path / "lie.npz").write_bytes(data.replace(b"(100000,)", b"(900000,)"))  # a header claiming 7.2 MB
    with pytest.raises(ValueError, match=r"lie\.npz: array 'a' runs past the end of the file \(truncated\?\)"):
        npz_member(tmp_path / "lie.npz", "a")


def test_a_compressed_array_of_exactly_the_bound_is_read(tmp_path, monkeypatch):
    np.savez_compressed(tmp_path / "c.npz", a=np.arange(1000, dtype=np.float32))
    monkeypatch.setattr(rows_module, "MAX_COMPRESSED_BYTES", 4000)
    assert npz_member(tmp_path / "c.npz", "a").sum() == sum(range(1000))


def test_a_file_over_the_whole_array_bound_is_read_in_rows(tmp_path, monkeypatch):
    import polyfuse.data.arrays as arrays
    from polyfuse.data.arrays import open_h5

    values = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle.create_dataset("x", data=values, chunks=(10, 4))  # 160-byte chunks
    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 1000)  # the 16,000-byte array may not be read whole
    with pytest.raises(ValueError, match=r"f\.h5: array 'x' would take 16000 bytes in memory"), open_h5(tmp_path / "f.h5"):
        pass
    np.testing.assert_array_equal(H5File(tmp_path / "f.h5").read("x", [999, 3]), values[[999, 3]])
    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 100)  # but one chunk must fit
    with pytest.raises(ValueError, match=r"array 'x \(one chunk\)' would take 160 bytes"):
        H5File(tmp_path / "f.h5")
