"""Per-id feature sequences of one file, read a few ids at a time (captioning videos,
retrieval experts), so that memory does not grow with the file.

:func:`open_sequences` reads a file's metadata up front (the ids, each id's real number
of steps, the feature size, every shape and length checked, the sizes agreeing) without
reading any feature; :meth:`SequenceFile.read` then reads the rows a batch asks for.
Layouts (``key``: ``PATH#KEY`` of a configuration):

* ``.npz`` keyed by id: one ``(T, d)`` (or ``(d,)``: T = 1) array per id, each a memory
  map of the file when stored uncompressed (``np.savez``), read on demand when
  compressed; ``key`` is refused (there is no array to pick);
* ``.npz`` / ``.h5`` stacked: ``video_ids`` (N,), a values array ``(N, T, d)`` or
  ``(N, d)`` (``key``, else the first array that is neither ``video_ids`` nor
  ``lengths``) and optionally ``lengths`` (N,), each id's real steps (default T); in
  HDF5, ``key`` may also name a group holding those arrays. An npz values array is a
  memory map when stored, read whole up to
  :data:`polyfuse.data.rows.MAX_COMPRESSED_BYTES` when compressed and refused above
  (:func:`polyfuse.data.rows.npz_member`);
* ``.h5`` / ``.hdf5`` with one ``(T, d)`` or ``(d,)`` dataset per id, at the root or in
  the group ``key`` (``polyfuse extract video`` writes ``motion`` and the like;
  retrieval experts ``features``).

Files are untrusted: npz arrays never unpickle and their headers are checked before
anything is read (:class:`polyfuse.data.arrays.NpzArrays`); HDF5 goes through
:class:`polyfuse.data.rows.H5File`. Values are not checked for NaN or Inf here: the
callers decide (captioning refuses them, retrieval reads an all-NaN array as a missing
expert). A :class:`SequenceFile` pickles without its file handles and memory maps and
reopens them in the process that reads (a data loader worker).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.data import rows as _rows
from polyfuse.data.arrays import NpzArrays
from polyfuse.data.rows import H5File, NpzMember, npz_member, npz_members

__all__ = ["SequenceFile", "check_video_ids", "open_sequences"]

_NOT_VALUES = ("video_ids", "lengths")
_NO_LIMIT = (
    1 << 62
)  # arrays read in rows are not bounded in size (a compressed one still by its ratio)


class SequenceFile:
    """Per-id (T_i, d) feature sequences of one file, read on demand."""

    def __init__(
        self, where: str, ids: list[str], lengths: np.ndarray, dim: int, reader: Any
    ) -> None:
        self.where = where  #: ``path#key``, for messages
        self.ids = ids  #: the ids in file order
        self.lengths = lengths  #: (N,) int64, the real steps of each id
        self.dim = dim  #: the feature size d
        self._reader = reader
        self._rows = {video: row for row, video in enumerate(ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, video_id: object) -> bool:
        return video_id in self._rows

    def row_of(self, video_id: str) -> int:
        """The row of ``video_id``; an id not in the file is a ValueError naming both."""
        try:
            return self._rows[video_id]
        except KeyError:
            raise ValueError(f"{self.where}: no features for video {video_id!r}") from None

    def read(self, rows: Sequence[int]) -> list[np.ndarray]:
        """The float32 (T_i, d) sequence of each row, in the order asked (repeats allowed),
        each a fresh array; values are not checked (see the module docstring)."""
        rows = [int(r) for r in rows]
        raw = self._reader.read(rows, self.lengths)
        return [
            np.array(a, dtype=np.float32, order="C").reshape(int(self.lengths[r]), self.dim)
            for r, a in zip(rows, raw, strict=True)
        ]


def open_sequences(path: str | Path, key: str | None = None) -> SequenceFile:
    """The sequences of ``path`` (``key``: the group or values array, see the module
    docstring), their metadata checked; a bad file is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"feature file not found: {path}")
    where = f"{path}{'#' + key if key else ''}"
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _open_npz(path, key, where)
    if suffix in (".h5", ".hdf5"):
        return _open_h5(path, key, where)
    raise ValueError(f"{path}: unsupported feature file type {suffix!r} (use .npz, .h5 or .hdf5)")


# -- checks shared by the layouts ----------------------------------------------------------


def _text_ids(values: np.ndarray, where: str) -> list[str]:
    """Ids as text (bytes decoded), refused when empty or repeated."""
    if values.ndim != 1:
        raise ValueError(f"{where}: video_ids has shape {values.shape}, expected (N,)")
    try:
        ids = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.tolist()]
    except UnicodeDecodeError:
        raise ValueError(f"{where}: video_ids holds bytes that are not UTF-8") from None
    return _checked_ids(ids, where)


def check_video_ids(ids: Sequence[str], where: str) -> list[str]:
    """``ids`` as a list, refusing an empty or repeated id."""
    seen: set[str] = set()
    for video in ids:
        if not video:
            raise ValueError(f"{where}: an empty video id")
        if video in seen:
            raise ValueError(f"{where}: duplicate video id {video!r}")
        seen.add(video)
    return list(ids)


def _checked_ids(ids: list[str], where: str) -> list[str]:
    check_video_ids(ids, where)
    if not ids:
        raise ValueError(f"{where}: no video features found")
    return ids


def _check_numeric(dtype: np.dtype, where: str, what: str) -> None:
    if dtype.kind not in "fiu":
        raise ValueError(f"{where}: {what} holds {dtype} values, not numbers")


def _stacked_lengths(
    ids: list[str], shape: tuple[int, ...], lengths: np.ndarray | None, where: str
) -> np.ndarray:
    """Each id's real steps from a stacked values array of ``shape`` and its lengths."""
    if len(shape) not in (2, 3):
        raise ValueError(
            f"{where}: expected an (N, T, d) or (N, d) array beside video_ids, got shape {shape}"
        )
    if len(ids) != shape[0]:
        raise ValueError(
            f"{where}: video_ids has {len(ids)} entries but the features have {shape[0]} rows"
        )
    steps = shape[1] if len(shape) == 3 else 1
    if shape[-1] < 1 or steps < 1:
        raise ValueError(f"{where}: the features have shape {shape}; expected T >= 1 and d >= 1")
    if lengths is None:
        return np.full(len(ids), steps, dtype=np.int64)
    lengths = np.asarray(lengths)
    if lengths.shape != (len(ids),):
        raise ValueError(f"{where}: lengths has shape {lengths.shape}, expected ({len(ids)},)")
    if lengths.dtype.kind not in "iuf" or (
        lengths.dtype.kind == "f" and not np.all(lengths == np.round(lengths))
    ):
        raise ValueError(f"{where}: lengths must be whole numbers, got {lengths.dtype}")
    bad = [
        (video, n) for video, n in zip(ids, lengths.tolist(), strict=True) if not 1 <= n <= steps
    ]
    if bad:
        raise ValueError(
            f"{where}: lengths disagree with the features (T = {steps}) for video "
            f"{bad[0][0]!r} (length {int(bad[0][1])}; {len(bad)} such videos)"
        )
    return lengths.astype(np.int64)


def _member_lengths(shapes: dict[str, tuple[int, ...]], where: str) -> tuple[np.ndarray, int]:
    """(lengths, d) of one (T, d) or (d,) array per id, the sizes agreeing."""
    dims: dict[int, str] = {}
    lengths = []
    for video, shape in shapes.items():
        if len(shape) not in (1, 2) or shape[0] < 1 or shape[-1] < 1:
            raise ValueError(
                f"{where}: video {video!r} has features of shape {shape}; expected (T >= 1, d) or (d,)"
            )
        dims.setdefault(shape[-1], video)
        lengths.append(shape[0] if len(shape) == 2 else 1)
    if len(dims) > 1:
        (d1, v1), (d2, v2) = list(dims.items())[:2]
        raise ValueError(
            f"{where}: feature sizes disagree: video {v1!r} has d = {d1}, video {v2!r} has d = {d2}"
        )
    return np.asarray(lengths, dtype=np.int64), next(iter(dims))


# -- npz -----------------------------------------------------------------------------------


def _open_npz(path: Path, key: str | None, where: str) -> SequenceFile:
    archive = NpzArrays(path, limit=_NO_LIMIT)  # every header checked: no pickles, no bombs
    names = list(archive)
    if "video_ids" in names:
        value_key = key or next((n for n in names if n not in _NOT_VALUES), None)
        if value_key not in names:
            raise ValueError(f"{path}: no array {value_key!r}; it has {', '.join(names)}")
        ids = _text_ids(archive["video_ids"], where)
        values = npz_member(path, value_key)  # a memory map when stored
        _check_numeric(values.dtype, where, f"array {value_key!r}")
        lengths = _stacked_lengths(
            ids, values.shape, archive["lengths"] if "lengths" in names else None, where
        )
        return SequenceFile(
            where, ids, lengths, int(values.shape[-1]), _NpzStacked(path, value_key, values)
        )
    if key:
        raise ValueError(f"{path}: '#{key}' names an array, but this npz is keyed by video id")
    members = npz_members(path)
    ids = _checked_ids(list(members), where)
    for video, member in members.items():
        _check_numeric(member.dtype, where, f"video {video!r}")
        if (
            member.offset is None
            and int(np.prod(member.shape, dtype=np.float64)) * member.dtype.itemsize
            > _rows.MAX_COMPRESSED_BYTES
        ):
            npz_member(
                path, video
            )  # refuses it, with the command that rewrites the file uncompressed
    lengths, dim = _member_lengths({video: m.shape for video, m in members.items()}, where)
    return SequenceFile(where, ids, lengths, dim, _NpzMembers(path, members))


class _NpzStacked:
    """Rows of one (N, T, d) or (N, d) npz array (a memory map when stored)."""

    def __init__(self, path: Path, name: str, values: np.ndarray) -> None:
        self.path, self.name, self._values = path, name, values

    def __getstate__(
        self,
    ) -> dict[str, Any]:  # a memory map is reopened, never copied into a pickle
        return {"path": self.path, "name": self.name, "_values": None}

    def read(self, rows: list[int], lengths: np.ndarray) -> list[np.ndarray]:
        if self._values is None:
            self._values = npz_member(self.path, self.name)
        values = self._values
        return [values[r, : int(lengths[r])] if values.ndim == 3 else values[r] for r in rows]


class _NpzMembers:
    """One npz array per id: views of one memory map of the file for stored arrays,
    decompressed on demand otherwise."""

    def __init__(self, path: Path, members: dict[str, NpzMember]) -> None:
        self.path, self.names = path, list(members)
        self.members = list(members.values())
        self._map: np.memmap | None = None
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_map": None, "_pid": None}

    def view(self, row: int) -> np.ndarray:
        """Row ``row``'s stored array as a view of the file's memory map (nothing read)."""
        member = self.members[row]
        if self._map is None or self._pid != os.getpid():
            self._map, self._pid = np.memmap(self.path, dtype=np.uint8, mode="r"), os.getpid()
        count = int(np.prod(member.shape, dtype=np.int64))
        flat = self._map[member.offset : member.offset + count * member.dtype.itemsize].view(
            member.dtype
        )
        return flat.reshape(member.shape, order="F" if member.fortran else "C")

    def read(self, rows: list[int], lengths: np.ndarray) -> list[np.ndarray]:
        out: dict[int, np.ndarray] = {}
        packed = [r for r in rows if self.members[r].offset is None]
        if packed:
            try:
                with zipfile.ZipFile(self.path) as archive:
                    for row in set(packed):
                        with archive.open(f"{self.names[row]}.npy") as stream:
                            out[row] = np.lib.format.read_array(stream, allow_pickle=False)
            except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as error:
                raise ValueError(
                    f"{self.path}: cannot read the array of video {self.names[packed[0]]!r} (corrupt?): {error}"
                ) from None
        return [out[r] if r in out else self.view(r) for r in rows]


# -- HDF5 ----------------------------------------------------------------------------------


def _open_h5(path: Path, key: str | None, where: str) -> SequenceFile:

    file = H5File(path)  # links, external storage and bombs refused once
    with file.opened() as handle:
        return _h5_layout(file, handle, path, key, where)


def _h5_layout(file: H5File, handle: Any, path: Path, key: str | None, where: str) -> SequenceFile:
    """The sequences of the open HDF5 file ``handle``, from its metadata."""
    import h5py

    group = handle
    if key:
        if key not in handle:
            raise ValueError(
                f"{path}: no group or array {key!r}; it has {', '.join(handle.keys())}"
            )
        group = handle[key]
    if isinstance(group, h5py.Dataset) or "video_ids" in group:
        holder = handle if isinstance(group, h5py.Dataset) else group
        if isinstance(group, h5py.Dataset):
            values_name = key
        else:
            values_name = next(
                (n for n in group if n not in _NOT_VALUES and isinstance(group[n], h5py.Dataset)),
                None,
            )
            if values_name is None:
                raise ValueError(f"{where}: video_ids without a features array beside it")
            values_name = f"{group.name.strip('/')}/{values_name}".strip("/")
        if "video_ids" not in holder:
            raise ValueError(f"{where}: no video_ids array beside the features")
        ids = _text_ids(np.asarray(holder["video_ids"][()]), where)
        values = handle[values_name]
        _check_numeric(values.dtype, where, f"dataset {values_name!r}")
        lengths_node = holder.get("lengths")
        lengths = _stacked_lengths(
            ids, values.shape, None if lengths_node is None else np.asarray(lengths_node[()]), where
        )
        return SequenceFile(
            where, ids, lengths, int(values.shape[-1]), _H5Stacked(file, values_name)
        )
    datasets = {str(video): node for video, node in group.items() if isinstance(node, h5py.Dataset)}
    ids = _checked_ids(list(datasets), where)
    for video, node in datasets.items():
        _check_numeric(node.dtype, where, f"video {video!r}")
    lengths, dim = _member_lengths({video: node.shape for video, node in datasets.items()}, where)
    prefix = f"{group.name.strip('/')}/" if group.name != "/" else ""
    return SequenceFile(
        where, ids, lengths, dim, _H5Members(file, [prefix + video for video in ids])
    )


class _H5Stacked:
    """Rows of one (N, T, d) or (N, d) HDF5 dataset, read in one selection per batch."""

    def __init__(self, file: H5File, name: str) -> None:
        self.file, self.name = file, name

    def read(self, rows: list[int], lengths: np.ndarray) -> list[np.ndarray]:
        block = self.file.read(self.name, rows)
        return [
            block[i, : int(lengths[r])] if block.ndim == 3 else block[i] for i, r in enumerate(rows)
        ]


class _H5Members:
    """One HDF5 dataset per id, each read whole when asked for, the file opened once a batch."""

    def __init__(self, file: H5File, names: list[str]) -> None:
        self.file, self.names = file, names

    def read(self, rows: list[int], lengths: np.ndarray) -> list[np.ndarray]:
        found = {}
        with self.file.opened() as handle:
            for row in set(rows):
                try:
                    found[row] = np.asarray(handle[self.names[row]][()])
                except (
                    OSError,
                    KeyError,
                ) as error:  # a damaged or changed file, found where it is damaged
                    raise ValueError(
                        f"{self.file.path}: cannot read dataset {self.names[row]!r} (truncated or corrupt?): {error}"
                    ) from None
        return [found[r] for r in rows]
