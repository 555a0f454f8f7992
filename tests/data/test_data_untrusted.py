"""Untrusted data files: npz read lazily within a size bound (no decompression bombs),
HDF5 files that would read other files refused, chunked HDF5 reads, strings that
are not UTF-8, pickles never loaded."""

import io
import zipfile

import h5py
import numpy as np
import pytest
import torch

import polyfuse.data.arrays as arrays_module
from polyfuse.data import load_arrays
from polyfuse.data.arrays import NpzArrays
from polyfuse.engine.checkpoints import read_checkpoint


def npy_bytes(header_shape, dtype="<f4", body=b""):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": header_shape})
    return buffer.getvalue() + body


def test_npz_bomb_is_refused_from_its_header(tmp_path):
    # The header claims 4 TB; nothing is inflated before the refusal.
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("seq.npy", npy_bytes((1_000_000, 1_000_000)) + b"\0" * 4096)
    with pytest.raises(ValueError, match=r"bomb\.npz: array 'seq' would take 4000000000000 bytes"):
        load_arrays(path)


def test_npz_size_bound_on_a_genuine_compressed_file(tmp_path):
    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, big=np.zeros((1000, 250), np.float32), small=np.ones(3))
    assert path.stat().st_size < 10_000  # 1 MB of zeros compresses ~1000x
    with pytest.raises(ValueError, match="over the limit of 100000 bytes"):
        NpzArrays(path, limit=100_000)


def test_npz_reads_only_the_arrays_asked_for(tmp_path, monkeypatch):
    path = tmp_path / "partly_broken.npz"
    good = io.BytesIO()
    np.save(good, np.arange(6.0))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("good.npy", good.getvalue())
        archive.writestr("broken.npy", npy_bytes((1000,), body=b"\1\2"))  # body far too short
    reads = []
    original = np.lib.format.read_array
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: reads.append(1) or original(*a, **k))
    table = load_arrays(path)
    assert reads == []  # nothing read up front
    np.testing.assert_array_equal(table.get("good", "a modality"), np.arange(6.0))
    assert len(reads) == 1
    with pytest.raises(ValueError, match=r"cannot read array 'broken' \(corrupt\?\)"):
        table.get("broken", "a modality")


def test_h5_external_storage_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:secret\n" * 4)
    path = tmp_path / "external.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("label", data=np.zeros(4))
        handle.create_dataset("seq", shape=(4, 18), dtype="u1", external=[(str(secret), 0, 72)])
    table = load_arrays(path)
    np.testing.assert_array_equal(table.get("label", "the label"), np.zeros(4))
    with pytest.raises(ValueError, match=r"dataset 'seq' keeps its data in external file\(s\).*secret\.txt"):
        table.get("seq", "a modality")


def test_h5_external_links_and_virtual_datasets_are_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle.create_dataset("x", data=np.arange(4.0))
    linked = tmp_path / "linked.h5"
    with h5py.File(linked, "w") as handle:
        handle.create_dataset("label", data=np.zeros(4))
        handle["group/seq"] = h5py.ExternalLink(str(other), "x")
    with pytest.raises(ValueError, match=r"'group/seq' is an external link to .*other\.h5"):
        load_arrays(linked)
    virtual = tmp_path / "virtual.h5"
    layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(other), "x", shape=(4,))
    with h5py.File(virtual, "w") as handle:
        handle.create_virtual_dataset("seq", layout)
    with pytest.raises(ValueError, match="'seq' is a virtual dataset"):
        load_arrays(virtual).get("seq", "a modality")


def test_h5_reads_in_chunks_to_the_same_values(tmp_path, monkeypatch):
    values = np.random.default_rng(0).normal(size=(37, 5, 3)).astype(np.float32)
    path = tmp_path / "chunks.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("seq", data=values, chunks=(4, 5, 3), compression="gzip")
    calls = []
    original = h5py.Dataset.read_direct
    monkeypatch.setattr(arrays_module, "_CHUNK_BYTES", 5 * 3 * 4 * 8)  # 8 rows a slice
    monkeypatch.setattr(h5py.Dataset, "read_direct", lambda self, *a: calls.append(a) or original(self, *a))
    np.testing.assert_array_equal(load_arrays(path).get("seq", "a modality"), values)
    assert len(calls) == 5  # ceil(37 / 8)


def test_h5_strings_that_are_not_utf8_name_the_array(tmp_path):
    path = tmp_path / "latin1.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("speaker", data=np.array([b"caf\xe9", b"ok"], dtype="S4"))
        handle.create_dataset("split", data=np.array([b"train", b"test"]))
    table = load_arrays(path)
    assert table.get("split", "split").tolist() == ["train", "test"]
    with pytest.raises(ValueError, match="array 'speaker' holds strings that are not UTF-8"):
        table.get("speaker", "group")


def test_a_directory_named_like_a_data_file_is_refused(tmp_path):
    (tmp_path / "features.npz").mkdir()
    with pytest.raises(ValueError, match=r"features\.npz is a directory, not a data file"):
        load_arrays(tmp_path / "features.npz")


def test_pickles_are_never_unpickled(tmp_path):
    disguised = tmp_path / "model.safetensors"  # a pickle under a safetensors name
    torch.save({"state_dict": {}}, disguised)
    with pytest.raises(ValueError, match="cannot read the checkpoint"):
        read_checkpoint(disguised)
    objects = tmp_path / "objects.npz"
    np.savez(objects, label=np.zeros(2), seq=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match=r"object \(pickled\) arrays, which are never loaded \('seq'\)"):
        load_arrays(objects)
