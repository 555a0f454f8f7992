"""Reading feature files: ``.npz`` and ``.h5``, one array per name.

The generic format (see docs/TRAINING.md):

- one array per modality, ``(N, T_j, d_j)`` (a sequence per sample, real steps
  first) or ``(N, d_j)`` (one vector per sample), float;
- optional ``<modality>_lengths``: ``(N,)`` ints, the real steps of each sample
  (default: all T_j);
- a label array, ``(N,)`` or ``(N, k)``;
- optional arrays of one value per sample: a split (strings such as
  ``train`` / ``val`` / ``test``), groups (a video or speaker id), an order
  key (a start time), ids.

Every problem with a file is a ``ValueError`` (or ``FileNotFoundError``) whose
message names the file and the array, raised here and not deep inside torch.

Files are treated as untrusted. Arrays are read lazily, only those asked for,
each within a bound on its decompressed size (:data:`MAX_ARRAY_BYTES`, set by the
environment variable ``POLYFUSE_MAX_ARRAY_BYTES``, default 8 GiB), and a compressed
array over 256 MiB in memory may inflate at most :data:`MAX_INFLATE_RATIO` times its
stored size (``POLYFUSE_MAX_INFLATE_RATIO``, default 100; float features compress 1 to
5 times): a decompression bomb in an npz or HDF5 file is refused from its header,
before anything is inflated. Object (pickled)
arrays are never loaded. HDF5 datasets that keep their data in other files
(external storage, virtual datasets) and external links are refused, so a file
cannot make polyfuse read some other local file; datasets are read in chunks.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_ARRAY_BYTES", "MAX_INFLATE_RATIO", "ArrayTable", "H5Arrays", "NpzArrays", "check_array_size",
    "check_h5_dataset", "load_arrays", "open_h5", "refuse_h5_links",
]

FEATURE_SUFFIXES = (".npz", ".h5", ".hdf5")
MAX_ARRAY_BYTES = int(os.environ.get("POLYFUSE_MAX_ARRAY_BYTES", str(8 << 30)))
MAX_INFLATE_RATIO = float(os.environ.get("POLYFUSE_MAX_INFLATE_RATIO", "100"))
_RATIO_FLOOR = 256 << 20  # arrays up to this size in memory are never refused for their compression ratio
_CHUNK_BYTES = 64 << 20  # HDF5 datasets are copied in slices of about this size


@dataclass
class ArrayTable:
    """Named arrays of a data source; ``origin`` names it in error messages.

    ``arrays`` may be a lazy mapping (:class:`NpzArrays`, :class:`H5Arrays`) that
    reads an array when it is first asked for.
    """

    origin: str
    arrays: Mapping[str, np.ndarray]
    #: the documented scale of the label when the format knows it (word-aligned MOSI /
    #: MMMO: (low, high); POM: a mapping from trait name to (low, high)); None otherwise
    label_range: Any = None
    #: the modalities a directory format holds (word-aligned: those present or asked
    #: for), read when ``data.modalities`` is not set; empty for single files
    modalities: tuple[str, ...] = ()
    #: names row i in messages (word-aligned: ``<dir>/y_test.h5 row 3``); default ``<origin> row i``
    row_origin: Callable[[int], str] | None = None
    #: True when the format already moved the real steps first (word-aligned), so that
    #: ``data.padding`` has been applied and is not applied again
    padding_applied: bool = False
    #: the data set the format names (word-aligned: the directory's name), for messages
    dataset: str | None = None

    def where(self, row: int) -> str:
        """The file and row of row ``row`` of the table, for messages."""
        return self.row_origin(row) if self.row_origin is not None else f"{self.origin} row {row}"

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def names(self) -> list[str]:
        return sorted(self.arrays)

    def get(self, name: str, what: str) -> np.ndarray:
        """The array ``name``; a missing one lists the arrays there are."""
        if name not in self.arrays:
            raise ValueError(
                f"{self.origin}: no array {name!r} (wanted as {what}); "
                f"arrays in the file: {', '.join(self.names())}"
            )
        return self.arrays[name]

    def per_sample(self, name: str, what: str, count: int) -> np.ndarray:
        """A one-value-per-sample array of length ``count`` (a split, group or order key)."""
        array = self.get(name, what)
        if array.ndim != 1 or array.shape[0] != count:
            raise ValueError(
                f"{self.origin}: {what} array {name!r} has shape {array.shape}, "
                f"expected ({count},): one value per sample"
            )
        return array


def check_array_size(path: Path | str, name: str, shape: tuple[int, ...], itemsize: int, *,
                     limit: int | None = None, stored: int | None = None) -> None:
    """Refuse an array whose header promises more than the bounds, before it is read.

    ``limit``: bytes in memory (default :data:`MAX_ARRAY_BYTES`); ``stored``: the bytes it
    takes in the file, when compressed: over 256 MiB in memory it may inflate at most
    :data:`MAX_INFLATE_RATIO` times."""
    limit = MAX_ARRAY_BYTES if limit is None else limit
    size = int(np.prod(shape, dtype=np.float64)) * itemsize
    if size > limit:
        raise ValueError(
            f"{path}: array {name!r} would take {size} bytes in memory {tuple(shape)}, over the limit of "
            f"{limit} bytes (a decompression bomb?); raise POLYFUSE_MAX_ARRAY_BYTES if the file is genuine"
        )
    if stored is not None and size > _RATIO_FLOOR and size > MAX_INFLATE_RATIO * max(stored, 1):
        raise ValueError(
            f"{path}: array {name!r} would inflate from {stored} stored bytes to {size} bytes in memory "
            f"{tuple(shape)}, over {MAX_INFLATE_RATIO:g} times (a decompression bomb?); raise "
            "POLYFUSE_MAX_INFLATE_RATIO if the file is genuine"
        )


def refuse_h5_links(handle: Any, path: Path | str) -> None:
    """Refuse an HDF5 file holding an external link (to a dataset of another file)."""
    import h5py

    def visit(group: Any, prefix: str) -> None:
        for key in group:
            link = group.get(key, getlink=True)
            name = f"{prefix}{key}"
            if isinstance(link, h5py.ExternalLink):
                raise ValueError(
                    f"{path}: {name!r} is an external link to {link.filename!r}; links to other files are refused"
                )
            if isinstance(link, h5py.HardLink) and isinstance(group[key], h5py.Group):
                visit(group[key], name + "/")

    visit(handle, "")


def check_h5_dataset(dataset: Any, path: Path | str, name: str, limit: int | None = None, *, whole: bool = True) -> None:
    """Refuse an HDF5 dataset that keeps its data in other files (external storage, a
    virtual dataset) or would inflate beyond the bounds of :func:`check_array_size`.

    ``whole=False``: the dataset is read in rows, never whole (:mod:`polyfuse.data.rows`),
    so its size is not bounded, only one chunk's and the inflation ratio."""
    if dataset.external:
        raise ValueError(
            f"{path}: dataset {name!r} keeps its data in external file(s) "
            f"{[str(e[0]) for e in dataset.external]}; external storage is refused"
        )
    if dataset.is_virtual:
        raise ValueError(f"{path}: dataset {name!r} is a virtual dataset (data in other files); refused")
    chunked = dataset.chunks is not None  # only chunked datasets can be compressed
    stored = dataset.id.get_storage_size() if chunked else None
    if not whole:
        if chunked:
            check_array_size(path, f"{name} (one chunk)", dataset.chunks, dataset.dtype.itemsize, limit=limit)
        limit = 1 << 62  # the ratio still refuses a bomb
    check_array_size(path, name, dataset.shape or (), dataset.dtype.itemsize, limit=limit, stored=stored)


@contextlib.contextmanager
def open_h5(path: Path | str, *, whole: bool = True) -> Iterator[Any]:
    """An HDF5 file opened for reading, every dataset in it checked first: no external
    links, no external storage or virtual datasets, none beyond the size bounds
    (``whole=False``: for a file read in rows, the bounds of one chunk and the inflation
    ratio). The one door through which polyfuse reads HDF5 feature files."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"{path}: cannot read as HDF5 (corrupt or not an HDF5 file): {error}") from None
    with handle:
        refuse_h5_links(handle, path)
        datasets: list[tuple[str, Any]] = []
        handle.visititems(lambda name, node: datasets.append((name, node)) if isinstance(node, h5py.Dataset) else None)
        for name, dataset in datasets:
            check_h5_dataset(dataset, path, name, whole=whole)
        yield handle


class NpzArrays(Mapping[str, np.ndarray]):
    """The arrays of an ``.npz`` file, each read (and checked) when first asked for."""

    def __init__(self, path: Path, limit: int = MAX_ARRAY_BYTES) -> None:
        self.path, self.limit = path, limit
        self._cache: dict[str, np.ndarray] = {}
        self._headers: dict[str, tuple[str, tuple[int, ...], np.dtype]] = {}
        try:
            file_size = path.stat().st_size
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    if not info.filename.endswith(".npy"):
                        continue
                    name = info.filename[: -len(".npy")]
                    stored = min(info.compress_size, file_size) if info.compress_type != zipfile.ZIP_STORED else None
                    with archive.open(info) as member:
                        shape, dtype = self._header(member, name, stored)
                    self._headers[name] = (info.filename, shape, dtype)
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise ValueError(f"{path}: cannot read as .npz (corrupt or not an npz file): {error}") from None

    def _header(self, member: Any, name: str, stored: int | None) -> tuple[tuple[int, ...], np.dtype]:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"npy format version {version} is not supported (1.0 and 2.0 are)")
        except ValueError as error:
            raise ValueError(f"{self.path}: array {name!r} has a broken header: {error}") from None
        if dtype.hasobject:
            raise ValueError(
                f"{self.path}: holds object (pickled) arrays, which are never loaded ({name!r}); "
                "store strings as fixed-width unicode arrays (dtype 'U')"
            )
        check_array_size(self.path, name, shape, dtype.itemsize, limit=self.limit, stored=stored)
        return shape, dtype

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            member_name, shape, dtype = self._headers[name]
            try:
                with zipfile.ZipFile(self.path) as archive, archive.open(member_name) as member:
                    array = np.lib.format.read_array(member, allow_pickle=False)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
                raise ValueError(f"{self.path}: cannot read array {name!r} (corrupt?): {error}") from None
            if array.shape != shape or array.dtype != dtype:  # pragma: no cover - read_array uses the same header
                raise ValueError(f"{self.path}: array {name!r} does not match its header")
            self._cache[name] = array
        return self._cache[name]

    def __contains__(self, name: object) -> bool:  # never reads the array (Mapping's would)
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)


class H5Arrays(Mapping[str, np.ndarray]):
    """The datasets of an HDF5 file by path, each read in chunks when first asked for.

    Only datasets reached by hard links are listed; external links, external
    storage and virtual datasets are refused (they read other files).
    """

    def __init__(self, path: Path, limit: int = MAX_ARRAY_BYTES) -> None:
        import h5py

        self.path, self.limit = path, limit
        self._cache: dict[str, np.ndarray] = {}
        self._names: list[str] = []
        try:
            with h5py.File(path, "r") as handle:
                refuse_h5_links(handle, path)
                handle.visititems(lambda name, node: self._names.append(name) if isinstance(node, h5py.Dataset) else None)
        except OSError as error:
            raise ValueError(f"{path}: cannot read as HDF5 (corrupt or not an HDF5 file): {error}") from None

    def _read(self, dataset: Any, name: str) -> np.ndarray:
        check_h5_dataset(dataset, self.path, name, self.limit)
        if dataset.dtype.kind in "OSV" or dataset.ndim == 0:
            value = dataset[()]
        else:
            value = np.empty(dataset.shape, dtype=dataset.dtype)
            row_bytes = max(1, value.nbytes // max(1, dataset.shape[0]))
            step = max(1, _CHUNK_BYTES // row_bytes)
            for start in range(0, dataset.shape[0], step):
                dataset.read_direct(value, np.s_[start : start + step], np.s_[start : start + step])
        if isinstance(value, (bytes, np.bytes_)) or (isinstance(value, np.ndarray) and value.dtype.kind in "OS"):
            flat = np.asarray(value).ravel()
            try:
                texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{self.path}: array {name!r} holds strings that are not UTF-8 ({error.reason}); "
                    "store them as UTF-8"
                ) from None
            value = np.array(texts).reshape(np.shape(value))
        return np.asarray(value)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            if name not in self._names:
                raise KeyError(name)
            import h5py

            try:
                with h5py.File(self.path, "r") as handle:
                    self._cache[name] = self._read(handle[name], name)
            except OSError as error:
                raise ValueError(f"{self.path}: cannot read dataset {name!r} (corrupt?): {error}") from None
        return self._cache[name]

    def __contains__(self, name: object) -> bool:  # never reads the dataset (Mapping's would)
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def load_arrays(path: str | Path) -> ArrayTable:
    """The arrays of an ``.npz`` or ``.h5`` file (datasets of an .h5 file by their path), read lazily."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a data file")
    suffix = path.suffix.lower()
    arrays: Mapping[str, np.ndarray]
    if suffix == ".npz":
        arrays = NpzArrays(path)
    elif suffix in (".h5", ".hdf5"):
        try:
            import h5py  # noqa: F401
        except ImportError:  # pragma: no cover - h5py is in the train extra
            raise ValueError(f"{path}: reading .h5 files needs h5py (pip install 'polyfuse[train]')") from None
        arrays = H5Arrays(path)
    else:
        raise ValueError(
            f"{path}: unknown data format {suffix or '(no suffix)'!r}; expected one of "
            f"{', '.join(FEATURE_SUFFIXES)} or a 'synthetic:...' source"
        )
    if not len(arrays):
        raise ValueError(f"{path}: holds no arrays")
    return ArrayTable(str(path), arrays)
