"""The bottom-up-attention release's TSV of region features, converted to ban-vqa's
*adaptive* HDF5 layout (:mod:`polyfuse.data.formats.features`).

The TSV (``tools/generate_tsv.py`` of bottom-up-attention, e.g.
``trainval_resnet101_faster_rcnn_genome.tsv``): one image per line, no header, six
tab-separated fields ``image_id, image_w, image_h, num_boxes, boxes, features``, where
``boxes`` is the base64 of float32 (num_boxes, 4) pixel boxes (x1, y1, x2, y2) and
``features`` the base64 of float32 (num_boxes, d), d (2048 in the release) the same on
every line. Lines are split on tabs, not read with :mod:`csv`, whose field size limit
(128 KiB) is far below the ~1 MB of a line of 100 boxes. Blank lines are skipped.

:func:`import_bottom_up` writes, as ban-vqa's ``adaptive_detection_features_converter.py``
does, ``image_features`` (R, d), ``spatial_features`` (R, 6) = (x1/w, y1/h, x2/w, y2/h,
(x2-x1)/w, (y2-y1)/h) in float32 arithmetic, ``image_bb`` (R, 4) pixel boxes and
``pos_boxes`` (N, 2) int64 rows [start, end) of each image, plus ``image_ids`` (N,) and
``tsv_lines`` (N,) (the line of each image, for messages and resuming). The image-id
index is JSON ``{"<image id>": row of pos_boxes}``, by default beside the HDF5 file with
ban-vqa's name: ``train.hdf5`` -> ``train_imgid2idx.json`` (ban-vqa pickles it as
``train_imgid2idx.pkl``; polyfuse never pickles).

The conversion streams: one line is decoded at a time and rows are appended to
resizable, chunked datasets every :data:`FLUSH_BOXES` boxes or :data:`FLUSH_LINES`
lines, so memory stays bounded whatever the size of the TSV. After each append the
file's attributes record what was consumed (``lines_done``, ``bytes_done``,
``images_done``, ``boxes_done``) with the input's name and size (``source_name``,
``source_bytes``) and a checksum of the last line consumed (``last_line_start``,
``last_line_sha256``), and the file is flushed. A rerun on a partial output of the same
input (same name, the line ending at ``bytes_done`` unchanged: a fix of a later line may
change the size) truncates the datasets to the recorded rows, seeks to ``bytes_done`` and
continues; a finished file (``complete=True``) is left alone; a file of another input
(or not written here) is refused unless ``overwrite=True``. A bad line stops the import
with one line ``<tsv> line <n> (image id <id>): <what>``; the rows before it stay, so a
rerun once the line is fixed resumes there. The index JSON is written last (a temporary
name renamed), then ``complete`` is set.

Existing outputs are read through :func:`polyfuse.data.arrays.open_h5` (checked) before
h5py opens them for appending.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from polyfuse.atomic import atomic_write_text
from polyfuse.data.arrays import open_h5
from polyfuse.progress import progress_bar, say

__all__ = [
    "FLUSH_BOXES",
    "FLUSH_LINES",
    "LAYOUT",
    "MAX_LINE_BYTES",
    "TSV_FIELDS",
    "AdaptiveWriter",
    "BottomUpImport",
    "default_index_path",
    "import_bottom_up",
    "read_tsv_line",
    "spatial_features",
]

#: the fields of a line of the bottom-up-attention TSV, in order
TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
#: the longest line read (a line of 100 boxes of 2048-d features takes about 1.1 MB)
MAX_LINE_BYTES = 256 << 20
#: rows are appended (and the progress attributes flushed) every this many boxes or lines
FLUSH_BOXES = 1024
FLUSH_LINES = 64
#: the ``layout`` attribute of the files written here
LAYOUT = "ban-vqa adaptive (polyfuse import-bottom-up)"
_CHUNK_ROWS = 256  # rows per HDF5 chunk of image_features


def _fail(path: Any, line_number: int, image_id: Any, what: str) -> ValueError:
    return ValueError(
        f"{path} line {line_number} (image id {'?' if image_id is None else image_id}): {what}"
    )


def _integer(field: str | bytes, name: str, path: Any, line_number: int, image_id: Any) -> int:
    text = field.decode("ascii", "replace") if isinstance(field, bytes) else field
    try:
        return int(text)
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise _fail(path, line_number, image_id, f"{name} {shown!r} is not an integer") from None


def _floats(
    field: str | bytes, name: str, path: Any, line_number: int, image_id: Any
) -> np.ndarray:
    try:
        raw = base64.b64decode(field, validate=True)
    except (binascii.Error, ValueError) as error:
        raise _fail(path, line_number, image_id, f"{name} is not valid base64 ({error})") from None
    if len(raw) % 4:
        raise _fail(
            path,
            line_number,
            image_id,
            f"{name} holds {len(raw)} bytes, not a whole number of float32",
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32, copy=False)


def read_tsv_line(
    line: str | bytes, path: Any, line_number: int, *, feature_dim: int | None = None
) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """``(image_id, image_w, image_h, boxes (n, 4), features (n, d))`` of one TSV line
    (str or bytes, with or without its line ending), float32 arrays.

    ``feature_dim``: the d of the lines before (None: any); d is inferred from the size of
    ``features``. ``path`` and ``line_number`` (1-based) only name the line in messages.

    Raises:
        ValueError: ``<path> line <n> (image id <id or ?>): <what>`` for a number of
            fields other than 6, a non-integer id, size or box count, a size or box count
            below 1, invalid base64, sizes that do not match ``num_boxes`` (or d other
            than ``feature_dim``), NaN or Inf.
    """
    tab, ends = (b"\t", (b"\r\n", b"\n")) if isinstance(line, bytes) else ("\t", ("\r\n", "\n"))
    for end in ends:
        if line.endswith(end):
            line = line[: -len(end)]
            break
    fields = line.split(tab)
    first = fields[0].decode("ascii", "replace") if isinstance(fields[0], bytes) else fields[0]
    image_id: Any = first.strip() if first.strip().lstrip("-").isdigit() else None
    if len(fields) != len(TSV_FIELDS):
        raise _fail(
            path,
            line_number,
            image_id,
            f"{len(fields)} tab-separated field(s), expected {len(TSV_FIELDS)}: {', '.join(TSV_FIELDS)}",
        )
    image_id = _integer(fields[0], "image_id", path, line_number, None)
    image_w, image_h, num_boxes = (
        _integer(fields[k], TSV_FIELDS[k], path, line_number, image_id) for k in (1, 2, 3)
    )
    for name, value in (("image_w", image_w), ("image_h", image_h), ("num_boxes", num_boxes)):
        if value < 1:
            raise _fail(path, line_number, image_id, f"{name} is {value}, expected at least 1")
    boxes = _floats(fields[4], "boxes", path, line_number, image_id)
    if boxes.size != num_boxes * 4:
        raise _fail(
            path,
            line_number,
            image_id,
            f"boxes hold {boxes.size} floats, expected num_boxes x 4 = {num_boxes * 4}",
        )
    features = _floats(fields[5], "features", path, line_number, image_id)
    if features.size == 0 or features.size % num_boxes:
        raise _fail(
            path,
            line_number,
            image_id,
            f"features hold {features.size} floats, not a multiple of num_boxes = {num_boxes}",
        )
    dim = features.size // num_boxes
    if feature_dim is not None and dim != feature_dim:
        raise _fail(
            path,
            line_number,
            image_id,
            f"features are {dim}-d ({features.size} floats / {num_boxes} boxes); "
            f"the lines before hold {feature_dim}-d features",
        )
    boxes, features = boxes.reshape(num_boxes, 4), features.reshape(num_boxes, dim)
    for name, values in (("boxes", boxes), ("features", features)):
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            raise _fail(
                path,
                line_number,
                image_id,
                f"{name} hold NaN or Inf in {int(bad.sum())} box(es), the first box {int(np.flatnonzero(bad)[0])}",
            )
    return image_id, image_w, image_h, boxes, features


def spatial_features(boxes: np.ndarray, image_w: int, image_h: int) -> np.ndarray:
    """(n, 6) float32 (x1/w, y1/h, x2/w, y2/h, (x2-x1)/w, (y2-y1)/h) of (n, 4) pixel boxes,
    in float32 arithmetic as ban-vqa's converter computes them."""
    boxes = np.asarray(boxes, dtype=np.float32)
    w, h = np.float32(image_w), np.float32(image_h)
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return np.stack([x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w, (y2 - y1) / h], axis=1).astype(
        np.float32
    )


def default_index_path(out_h5: str | Path) -> Path:
    """ban-vqa's name of the index beside ``out_h5``, as JSON: ``train.hdf5`` -> ``train_imgid2idx.json``."""
    out_h5 = Path(out_h5)
    return out_h5.with_name(f"{out_h5.stem}_imgid2idx.json")


class AdaptiveWriter:
    """Appends images to the adaptive layout in an HDF5 file open for writing, a small
    buffer at a time; :meth:`flush` writes the buffer and the progress attributes."""

    def __init__(self, handle: h5py.File, feature_dim: int) -> None:
        self.handle, self.feature_dim = handle, feature_dim
        shapes = {
            "image_features": (feature_dim, "f4", _CHUNK_ROWS),
            "spatial_features": (6, "f4", 4096),
            "image_bb": (4, "f4", 4096),
            "pos_boxes": (2, "i8", 4096),
        }
        for name, (width, dtype, rows) in shapes.items():
            if name not in handle:
                handle.create_dataset(
                    name, (0, width), maxshape=(None, width), dtype=dtype, chunks=(rows, width)
                )
        for name in ("image_ids", "tsv_lines"):
            if name not in handle:
                handle.create_dataset(name, (0,), maxshape=(None,), dtype="i8", chunks=(4096,))
        self.images, self.boxes = len(handle["pos_boxes"]), len(handle["image_features"])
        self._buffer: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered_boxes = 0
        self.min_boxes = self.max_boxes = None
        if self.images:
            pos = handle["pos_boxes"][:]
            counts = pos[:, 1] - pos[:, 0]
            self.min_boxes, self.max_boxes = int(counts.min()), int(counts.max())

    def truncate(self, images: int, boxes: int) -> None:
        """Drop the rows after ``images`` images and ``boxes`` boxes (those written after
        the last recorded flush)."""
        for name in ("image_features", "spatial_features", "image_bb"):
            self.handle[name].resize(boxes, axis=0)
        for name in ("pos_boxes", "image_ids", "tsv_lines"):
            self.handle[name].resize(images, axis=0)
        self.images, self.boxes = images, boxes
        self.__init__(self.handle, self.feature_dim)  # box-count range of what is left

    def add(
        self,
        image_id: int,
        line_number: int,
        image_w: int,
        image_h: int,
        boxes: np.ndarray,
        features: np.ndarray,
    ) -> None:
        count = len(boxes)
        self._buffer.append(
            (image_id, line_number, boxes, spatial_features(boxes, image_w, image_h), features)
        )
        self._buffered_boxes += count
        self.min_boxes = count if self.min_boxes is None else min(self.min_boxes, count)
        self.max_boxes = count if self.max_boxes is None else max(self.max_boxes, count)

    @property
    def pending(self) -> int:
        """Images added and not yet written."""
        return len(self._buffer)

    def full(self) -> bool:
        return self._buffered_boxes >= FLUSH_BOXES or len(self._buffer) >= FLUSH_LINES

    def flush(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Append the buffered images, then set ``attrs`` and flush the file."""
        if self._buffer:
            counts = np.array([len(b[2]) for b in self._buffer], dtype=np.int64)
            ends = self.boxes + np.cumsum(counts)
            pos = np.stack([ends - counts, ends], axis=1)
            columns = {
                "image_features": np.concatenate([b[4] for b in self._buffer]),
                "spatial_features": np.concatenate([b[3] for b in self._buffer]),
                "image_bb": np.concatenate([b[2] for b in self._buffer]),
            }
            for name, rows in columns.items():
                self.handle[name].resize(self.boxes + len(rows), axis=0)
                self.handle[name][self.boxes :] = rows
            rows_of = {
                "pos_boxes": pos,
                "image_ids": np.array([b[0] for b in self._buffer], dtype=np.int64),
                "tsv_lines": np.array([b[1] for b in self._buffer], dtype=np.int64),
            }
            for name, rows in rows_of.items():
                self.handle[name].resize(self.images + len(rows), axis=0)
                self.handle[name][self.images :] = rows
            self.images += len(self._buffer)
            self.boxes = int(ends[-1])
            self._buffer, self._buffered_boxes = [], 0
        self.handle.attrs.update(
            {"images_done": self.images, "boxes_done": self.boxes, **(attrs or {})}
        )
        self.handle.flush()

    def index(self) -> dict[str, int]:
        """``{"<image id>": row}`` of what is written (the buffer flushed first)."""
        return {str(int(i)): row for row, i in enumerate(self.handle["image_ids"][: self.images])}


@dataclass(frozen=True)
class BottomUpImport:
    """What :func:`import_bottom_up` wrote."""

    h5_path: Path
    index_path: Path
    images: int
    boxes: int
    feature_dim: int
    min_boxes: int
    max_boxes: int
    seconds: float
    resumed_at_line: int = 0  # lines consumed by an earlier, interrupted run (0: a fresh import)
    already_complete: bool = False  # the file was finished before: left alone

    def lines(self) -> list[str]:
        """The summary in two lines, for the command line."""
        how = (
            " (already complete: left alone)"
            if self.already_complete
            else f" (resumed after line {self.resumed_at_line})"
            if self.resumed_at_line
            else ""
        )
        return [
            f"{self.h5_path}: {self.images} images, {self.boxes} boxes of {self.feature_dim}-d features, "
            f"{self.min_boxes} to {self.max_boxes} boxes per image, in {self.seconds:.1f} s{how}",
            f"image id index: {self.index_path}",
        ]


def _attr(attrs: Mapping[str, Any], name: str, default: Any = None) -> Any:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _line_hash(source: Path, start: int, end: int) -> str:
    with source.open("rb") as handle:
        handle.seek(start)
        return hashlib.sha256(handle.read(end - start)).hexdigest()


def _existing(out_h5: Path, tsv_path: Path, overwrite: bool) -> dict[str, Any] | None:
    """The state of a partial or finished output of the same input (None: start anew);
    refuses an output of another input unless ``overwrite``."""
    if not out_h5.exists():
        return None
    if overwrite:
        out_h5.unlink()
        return None
    redo = "pass overwrite=True (--overwrite) to replace it, or write elsewhere"
    with open_h5(out_h5) as handle:
        attrs = dict(handle.attrs)
        if _attr(attrs, "layout") != LAYOUT:
            raise ValueError(
                f"{out_h5} exists and was not written by polyfuse's bottom-up import; {redo}"
            )
        state = {
            k: _attr(attrs, k, 0)
            for k in (
                "source_bytes",
                "lines_done",
                "bytes_done",
                "images_done",
                "boxes_done",
                "last_line_start",
            )
        }
        state.update(
            {
                k: _attr(attrs, k)
                for k in ("source_name", "last_line_sha256", "complete", "feature_dim")
            }
        )
        images = int(state["images_done"])
        state["ids"] = (
            handle["image_ids"][:images] if "image_ids" in handle else np.zeros(0, np.int64)
        )
        state["lines"] = (
            handle["tsv_lines"][:images] if "tsv_lines" in handle else np.zeros(0, np.int64)
        )
        pos = handle["pos_boxes"][:images] if "pos_boxes" in handle else np.zeros((0, 2), np.int64)
        state["counts"] = pos[:, 1] - pos[:, 0]
    if state["source_name"] != tsv_path.name:
        raise ValueError(
            f"{out_h5} holds the import of {state['source_name']}, not of {tsv_path.name}; {redo}"
        )
    size, done = tsv_path.stat().st_size, int(state["bytes_done"])
    start = int(state["last_line_start"])
    if done > size or (done and _line_hash(tsv_path, start, done) != state["last_line_sha256"]):
        raise ValueError(
            f"{out_h5} holds an import of {tsv_path.name} whose lines up to {state['lines_done']} (byte {done}) "
            f"differ from those of {tsv_path} now: the input changed; {redo}"
        )
    return state


def import_bottom_up(
    tsv_path: str | Path,
    out_h5: str | Path,
    *,
    index_path: str | Path | None = None,
    progress: bool = True,
    overwrite: bool = False,
) -> BottomUpImport:
    """Convert the bottom-up TSV ``tsv_path`` to the adaptive HDF5 ``out_h5`` and its
    JSON index (default :func:`default_index_path`), streaming and resumable (module
    docstring). ``progress``: a bar over the bytes of the TSV on a terminal.

    Raises:
        ValueError: a bad line (``<tsv> line <n> (image id <id>): <what>``), an image id
            met twice (naming both lines), an input without images, an existing output
            of another input (unless ``overwrite``).
        FileNotFoundError: no ``tsv_path``.
    """
    began = time.perf_counter()
    tsv_path, out_h5 = Path(tsv_path), Path(out_h5)
    index_path = default_index_path(out_h5) if index_path is None else Path(index_path)
    if not tsv_path.is_file():
        raise FileNotFoundError(f"bottom-up TSV {tsv_path} does not exist")
    state = _existing(out_h5, tsv_path, overwrite)
    if state is not None and state["complete"]:
        counts = state["counts"]
        if not index_path.is_file():
            atomic_write_text(
                index_path, json.dumps({str(int(i)): r for r, i in enumerate(state["ids"])})
            )
        say(f"{out_h5} already holds the complete import of {tsv_path.name}: left alone")
        return BottomUpImport(
            out_h5,
            index_path,
            len(counts),
            int(state["boxes_done"]),
            int(state["feature_dim"]),
            int(counts.min()),
            int(counts.max()),
            time.perf_counter() - began,
            int(state["lines_done"]),
            True,
        )
    size = tsv_path.stat().st_size
    seen: dict[int, int] = {}
    lines_done = bytes_done = last_start = 0
    feature_dim: int | None = None
    if state is not None:
        seen = dict(zip(state["ids"].tolist(), state["lines"].tolist(), strict=True))
        lines_done, bytes_done, last_start = (
            int(state["lines_done"]),
            int(state["bytes_done"]),
            int(state["last_line_start"]),
        )
        feature_dim = int(state["feature_dim"]) if state["feature_dim"] is not None else None
    out_h5.parent.mkdir(parents=True, exist_ok=True)
    handle = h5py.File(out_h5, "a")
    try:
        handle.attrs.update(
            {
                "layout": LAYOUT,
                "source_name": tsv_path.name,
                "source_bytes": size,
                "complete": False,
            }
        )
        writer = None
        if feature_dim is not None:
            writer = AdaptiveWriter(handle, feature_dim)
            writer.truncate(int(state["images_done"]), int(state["boxes_done"]))
        else:  # nothing written yet (or only a blank line): start clean
            for name in list(handle):
                del handle[name]
            seen, lines_done, bytes_done, last_start = {}, 0, 0, 0
            handle.attrs.update({"images_done": 0, "boxes_done": 0})
        progress_attrs: dict[str, Any] = {
            "lines_done": lines_done,
            "bytes_done": bytes_done,
            "last_line_start": last_start,
            "last_line_sha256": _line_hash(tsv_path, last_start, bytes_done),
        }
        handle.attrs.update(progress_attrs)
        with (
            tsv_path.open("rb") as source,
            progress_bar(
                total=size,
                initial=bytes_done,
                unit="B",
                unit_scale=True,
                desc=tsv_path.name,
                show=progress,
            ) as bar,
        ):
            source.seek(bytes_done)
            number, offset = lines_done, bytes_done
            while True:
                start = offset
                raw = source.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                number += 1
                offset += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise _fail(
                        tsv_path,
                        number,
                        None,
                        f"longer than {MAX_LINE_BYTES} bytes: not a line of the TSV",
                    )
                if raw.strip():
                    try:
                        image_id, image_w, image_h, boxes, features = read_tsv_line(
                            raw, tsv_path, number, feature_dim=feature_dim
                        )
                    except ValueError:
                        if writer is not None:
                            writer.flush(progress_attrs)
                        raise
                    if image_id in seen:
                        if writer is not None:
                            writer.flush(progress_attrs)
                        raise _fail(
                            tsv_path,
                            number,
                            image_id,
                            f"image id {image_id} already on line {seen[image_id]}: each image once",
                        )
                    seen[image_id] = number
                    if writer is None:
                        feature_dim = features.shape[1]
                        handle.attrs["feature_dim"] = feature_dim
                        writer = AdaptiveWriter(handle, feature_dim)
                    writer.add(image_id, number, image_w, image_h, boxes, features)
                progress_attrs = {
                    "lines_done": number,
                    "bytes_done": offset,
                    "last_line_start": start,
                    "last_line_sha256": hashlib.sha256(raw).hexdigest(),
                }
                if writer is not None and writer.full():
                    writer.flush(progress_attrs)
                bar.update(len(raw))
        if writer is None or writer.images + writer.pending == 0:
            raise ValueError(f"{tsv_path}: no image (the file holds no line of the TSV)")
        writer.flush(progress_attrs)
        atomic_write_text(index_path, json.dumps(writer.index()))
        handle.attrs["complete"] = True
        handle.flush()
        return BottomUpImport(
            out_h5,
            index_path,
            writer.images,
            writer.boxes,
            feature_dim,
            int(writer.min_boxes),
            int(writer.max_boxes),
            time.perf_counter() - began,
            lines_done,
        )
    finally:
        handle.close()
