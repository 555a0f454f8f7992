"""Reading feature files a few rows at a time, so that memory does not grow with them.

- :class:`H5File`: an HDF5 file checked once through :func:`~polyfuse.data.arrays.open_h5`
  (no links to other files, no external storage or virtual datasets, no decompression
  bomb), then opened read-only for each read, so that no handle outlives a batch (nor
  crosses into a forked data loader worker).
- :func:`read_rows`: ``dataset[rows]`` for rows in any order and with repeats, as one
  read of the block they span when that block is dense and one sorted selection
  otherwise (h5py reads only increasing indices).
- :func:`npz_member`: an array of an ``.npz`` file as a memory map when it is stored
  uncompressed (the pages are read as they are touched and can be dropped again). A
  compressed array over :data:`MAX_COMPRESSED_BYTES` is refused with the command that
  rewrites the file uncompressed; a smaller one is read whole.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.data.arrays import open_h5

__all__ = ["MAX_COMPRESSED_BYTES", "H5File", "NpzMember", "npy_header", "npz_member", "npz_members", "read_rows"]

#: the largest compressed ``.npz`` array read whole (``POLYFUSE_MAX_COMPRESSED_NPZ_BYTES``)
MAX_COMPRESSED_BYTES = int(os.environ.get("POLYFUSE_MAX_COMPRESSED_NPZ_BYTES", str(256 << 20)))

#: rows of a dense block are read in one go when they fill at least this share of it
_DENSE = 0.5


class H5File:
    """An HDF5 file read in rows: checked once when made, opened for each read.

    Opening per read (a fraction of a millisecond) keeps no handle between batches: a
    loader worker forked from the main process never shares one (h5py handles do not
    survive a fork), and the file can be replaced or repaired between two runs of one
    process."""

    def __init__(self, path: str | Path) -> None:
        import h5py

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"feature file {self.path} does not exist")
        self.shapes: dict[str, tuple[int, ...]] = {}
        def record(name: str, node: Any) -> None:  # visititems stops at a callback's first non-None
            if isinstance(node, h5py.Dataset):
                self.shapes[name] = node.shape

        with open_h5(self.path, whole=False) as handle:  # every dataset checked once
            handle.visititems(record)

    @contextlib.contextmanager
    def opened(self) -> Iterator[Any]:
        """The file opened read-only; a file that can no longer be opened is a one-line error."""
        import h5py

        try:
            handle = h5py.File(self.path, "r")
        except OSError as error:
            raise ValueError(f"{self.path}: cannot read as HDF5 (corrupt or changed?): {error}") from None
        with handle:
            yield handle

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.shapes:
            raise ValueError(f"{self.path}: no dataset {name!r} (found {sorted(self.shapes)})")
        return self.shapes[name]

    def read(self, name: str, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows ``rows`` of dataset ``name`` (see :func:`read_rows`), a read error named."""
        self.shape(name)
        with self.opened() as handle:
            try:
                return read_rows(handle[name], rows)
            except OSError as error:  # a truncated or damaged file, found at the rows it damages
                raise ValueError(
                    f"{self.path}: cannot read rows of dataset {name!r} (truncated or corrupt?): {error}"
                ) from None

    def whole(self, name: str) -> np.ndarray:
        """A small dataset (an index, spans, ids) read whole."""
        return self.read(name, np.arange(self.shape(name)[0]))


def read_rows(dataset: Any, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """``dataset[rows]`` (an array or an h5py dataset) for rows in any order, repeats allowed."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return np.empty((0, *dataset.shape[1:]), dtype=dataset.dtype)
    unique, inverse = np.unique(rows, return_inverse=True)
    first, last = int(unique[0]), int(unique[-1])
    if first < 0 or last >= dataset.shape[0]:
        raise IndexError(f"rows {first}..{last} outside the {dataset.shape[0]} rows")
    if len(unique) >= _DENSE * (last - first + 1):
        block = np.asarray(dataset[first : last + 1])[unique - first]
    else:
        block = np.asarray(dataset[unique])
    return block[inverse]


@dataclass(frozen=True)
class NpzMember:
    """Where one array of an ``.npz`` lies: ``offset`` of its data in the file when stored
    uncompressed, None when compressed."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: int | None


def npz_members(path: str | Path) -> dict[str, NpzMember]:
    """Every array of an ``.npz`` with the place of its data, from one pass over the headers
    (pickled arrays and data past the end of the file refused)."""
    path = Path(path)
    members = {}
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive, path.open("rb") as handle:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                if info.compress_type != zipfile.ZIP_STORED:
                    with archive.open(info) as stream:
                        shape, dtype, fortran = npy_header(stream, path, name)
                    members[name] = NpzMember(shape, dtype, fortran, None)
                    continue
                handle.seek(info.header_offset)
                local = handle.read(30)
                if local[:4] != b"PK\x03\x04":
                    raise ValueError(f"bad local header of {info.filename!r}")
                names = int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
                handle.seek(info.header_offset + 30 + names)
                shape, dtype, fortran = npy_header(handle, path, name)
                offset = handle.tell()
                if offset + int(np.prod(shape, dtype=np.float64)) * dtype.itemsize > size:
                    raise ValueError(f"{path}: array {name!r} runs past the end of the file (truncated?)")
                members[name] = NpzMember(shape, dtype, fortran, offset)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"{path}: cannot read as .npz (corrupt?): {error}") from None
    return members


def npz_member(path: str | Path, name: str) -> np.ndarray:
    """Array ``name`` of the ``.npz`` file ``path``: a read-only memory map when stored
    uncompressed, else read whole up to :data:`MAX_COMPRESSED_BYTES`."""
    path = Path(path)
    member = npz_members(path).get(name)
    if member is None:
        raise ValueError(f"{path}: no array {name!r}")
    if member.offset is None:
        size = int(np.prod(member.shape, dtype=np.float64)) * member.dtype.itemsize
        if size > MAX_COMPRESSED_BYTES:
            raise ValueError(
                f"{path}: array {name!r} is compressed and takes {size} bytes, over the "
                f"{MAX_COMPRESSED_BYTES} bytes read whole (POLYFUSE_MAX_COMPRESSED_NPZ_BYTES); rewrite the file "
                "uncompressed so that it is read in rows: python -c \"import numpy as np, sys; "
                "np.savez(sys.argv[2], **np.load(sys.argv[1]))\" IN.npz OUT.npz"
            )
        try:
            with zipfile.ZipFile(path) as archive, archive.open(f"{name}.npy") as stream:
                return np.lib.format.read_array(stream, allow_pickle=False)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
            raise ValueError(f"{path}: cannot read array {name!r} (corrupt?): {error}") from None
    if 0 in member.shape:
        return np.zeros(member.shape, dtype=member.dtype)
    if not member.shape:  # one value (a memory map needs a dimension)
        return np.array(np.memmap(path, dtype=member.dtype, mode="r", offset=member.offset, shape=(1,))[0])
    return np.memmap(path, dtype=member.dtype, mode="r", offset=member.offset, shape=member.shape,
                     order="F" if member.fortran else "C")


def npy_header(stream: Any, path: Path, name: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, Fortran order) of the ``.npy`` header at ``stream``; pickles refused."""
    try:
        version = np.lib.format.read_magic(stream)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"npy format version {version} is not supported (1.0 and 2.0 are)")
        shape, fortran, dtype = read(stream)
    except ValueError as error:
        raise ValueError(f"{path}: array {name!r} has a broken header: {error}") from None
    if dtype.hasobject:
        raise ValueError(f"{path}: array {name!r} holds objects (pickles), which are never loaded")
    return tuple(shape), dtype, bool(fortran)
