"""Image features in HDF5: the file ``polyfuse extract images`` writes, and bottom-up
region features in the layouts the ban-vqa code reads.

polyfuse layout: ``features`` (N, O, d), ``boxes`` (N, O, 4) as (x1, y1, x2, y2) and
``image_ids`` (N,) in one file (the last row of an id wins).

ban-vqa layouts, each with a *pickle* mapping image id -> row:

- fixed (``tools/detection_features_converter.py``, ``{split}36.hdf5``): ``image_features``
  (N, O, d), ``spatial_features`` (N, O, 6) as (x1, y1, x2, y2, w, h) normalised by the
  image size, ``image_bb`` (N, O, 4) in pixels;
- adaptive (``tools/adaptive_detection_features_converter.py``, ``{split}.hdf5``, the one
  ban-vqa's VQA training reads: ``VQAFeatureDataset(adaptive=True)``): the boxes of all
  images stacked, ``image_features`` (R, d), ``spatial_features`` (R, 6), ``image_bb``
  (R, 4), and ``pos_boxes`` (N, 2) giving the rows [start, end) of each image's boxes
  (10 to 100 per image); the index maps an image id to its row of ``pos_boxes``.

Images with fewer boxes than the largest are padded with all-zero features and boxes,
which the VQA models mask (:func:`polyfuse.nn.models.vqa.image_mask`, as ban-vqa masks its
zero padding). A pickle can run code when read, so it is never opened: give the index as
JSON (``{"<image id>": row}``) or CSV (``image_id,row``); to convert one you trust:
``python -c "import pickle, json, sys; json.dump({str(k): v for k, v in
pickle.load(open(sys.argv[1], 'rb')).items()}, open(sys.argv[2], 'w'))" in.pkl out.json``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from polyfuse.data.arrays import open_h5
from polyfuse.data.formats.jsonfile import read_json
from polyfuse.data.rows import H5File

__all__ = [
    "BOX_DATASETS", "IN_MEMORY_BYTES", "ImageFeatures", "RegionFeatures", "check_image_ids", "is_bottom_up",
    "load_bottom_up_features", "load_image_features", "served",
]


@dataclass
class ImageFeatures:
    """Features and boxes of a set of images in memory, with the row of each image id
    (:meth:`RegionFeatures.load`: small files, tests and checks)."""

    features: Tensor  # (N, O, d) float32
    boxes: Tensor  # (N, O, 4) float32
    rows: dict[int, int]
    source: str

    @property
    def dim(self) -> int:
        return int(self.features.shape[-1])

    def check_ids(self, image_ids: Iterable[int], what: str = "questions") -> None:
        check_image_ids(self.rows, image_ids, self.source, what)

    def read(self, rows: Sequence[int] | np.ndarray) -> tuple[Tensor, Tensor]:
        """(features, boxes) of rows ``rows``, as :meth:`RegionFeatures.read`."""
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        return self.features[index], self.boxes[index]

    def select(self, image_ids: Sequence[int], *, what: str = "questions") -> tuple[Tensor, Tensor]:
        """(features, boxes) of ``image_ids`` in order; an id without features is an error."""
        self.check_ids(image_ids, what)
        return self.read([self.rows[i] for i in image_ids])


def check_image_ids(rows: Mapping[int, int], image_ids: Iterable[int], source: str, what: str) -> None:
    """Refuse image ids without a row, listing them."""
    missing = sorted({i for i in image_ids if i not in rows})
    if missing:
        raise ValueError(
            f"{source}: no features for image id(s) {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''} ({len(missing)} missing) used by the {what}"
        )


class RegionFeatures:
    """The features and boxes of the images of one HDF5 file (any layout of the module
    docstring), read when a batch asks for them: memory does not grow with the file.

    What can be checked without reading the features is checked when it is made:
    datasets present, the shapes of the layout, the index inside the images,
    ``pos_boxes`` spans (inside the stacked boxes, not empty, in order). NaN or Inf are
    refused when a batch reads them, naming the file, the dataset and the image id.
    """

    def __init__(self, path: str | Path, index_path: str | Path | None = None) -> None:
        path = Path(path)
        self.file, self.source = H5File(path), str(path)
        self.spans: np.ndarray | None = None  # adaptive: (images, 2), [start, end) of each row's boxes
        if index_path is None:
            self.feature_name, self.box_name = "features", "boxes"
            features, boxes = self.file.shape(self.feature_name), self.file.shape(self.box_name)
            ids = self.file.whole("image_ids")
            if not (features[0] == boxes[0] == len(ids)):
                raise ValueError(f"{path}: features, boxes and image_ids have {features[0]}, {boxes[0]}, {len(ids)} rows")
            self.rows = {int(image_id): row for row, image_id in enumerate(ids.tolist())}  # the last row of an id wins
            self.images = len(ids)
        else:
            index_path = Path(index_path)
            if not index_path.is_file():
                raise FileNotFoundError(f"{index_path} does not exist")
            self.rows = _read_index(index_path)
            self.feature_name = "image_features"
            self.box_name = next((n for n in BOX_DATASETS if n in self.file), BOX_DATASETS[0])
            features, boxes = self.file.shape(self.feature_name), self.file.shape(self.box_name)
            adaptive = "pos_boxes" in self.file
            layout, wanted = ("adaptive", 2) if adaptive else ("fixed", 3)
            if len(features) != wanted or len(boxes) != wanted or boxes[:-1] != features[:-1] or boxes[-1] < 4:
                expected = "(R, d) and (R, 4 or 6), R boxes" if adaptive else "(N, O, d) and (N, O, 4 or 6)"
                raise ValueError(
                    f"{path}: image_features {features} and {self.box_name} {boxes} do not match the "
                    f"{layout} layout: expected {expected}"
                )
            pos_boxes = self.file.whole("pos_boxes") if adaptive else None
            self.images = len(pos_boxes) if adaptive else features[0]
            bad = [k for k, v in self.rows.items() if not 0 <= v < self.images]
            if bad:
                what = "rows of pos_boxes" if adaptive else "images"
                raise ValueError(
                    f"{index_path}: rows of image ids {bad[:10]} lie outside [0, {self.images}), the {what} of {path}"
                )
            if adaptive:
                self.spans = np.zeros((self.images, 2), dtype=np.int64)  # rows the index does not use: no boxes
                for row, span in _image_boxes(pos_boxes, self.rows, features[0], path).items():
                    self.spans[row] = span
        if not self.images:
            raise ValueError(f"{path}: holds no images")
        if len(features) != (2 if self.spans is not None else 3):
            raise ValueError(f"{path}: {self.feature_name} has shape {features}, expected (images, boxes, d)")
        self.dim = int(features[-1])
        self._id_of_row = {row: image_id for image_id, row in sorted(self.rows.items(), reverse=True)}
        counts = None if self.spans is None else self.spans[:, 1] - self.spans[:, 0]
        self.max_boxes = int(features[1]) if counts is None else int(counts.max(initial=0))

    def image_id(self, row: int) -> int | str:
        """The image id of file row ``row`` (for messages)."""
        return self._id_of_row.get(int(row), "(none)")

    def check_ids(self, image_ids: Iterable[int], what: str = "questions") -> None:
        check_image_ids(self.rows, image_ids, self.source, what)

    def read(self, rows: Sequence[int] | np.ndarray, *, pad_to: int | None = None) -> tuple[Tensor, Tensor]:
        """(features (B, O, d), boxes (B, O, 4)) float32 of file rows ``rows``; an
        adaptive file's images padded with zeros to the most boxes among them (or
        ``pad_to``, at least), which the VQA models mask."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.spans is None:
            features = self.file.read(self.feature_name, rows)
            boxes = self.file.read(self.box_name, rows)[..., :4]
            self._check_finite(features, boxes, rows)  # every image has all O boxes: nothing to pad
            return (torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)),
                    torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float32)))
        spans = self.spans[rows].tolist()
        most = max([end - start for start, end in spans] + [pad_to or 0])
        features = np.zeros((len(rows), most, self.dim), dtype=np.float32)
        boxes = np.zeros((len(rows), most, 4), dtype=np.float32)
        with self.file.opened() as handle:
            feature_set, box_set = handle[self.feature_name], handle[self.box_name]
            for i, (start, end) in enumerate(spans):
                if end > start:
                    try:
                        features[i, : end - start] = feature_set[start:end]
                        boxes[i, : end - start] = box_set[start:end, :4]
                    except OSError as error:  # a truncated or damaged file, found where it is damaged
                        raise ValueError(
                            f"{self.source}: cannot read the boxes of image id {self.image_id(rows[i])} "
                            f"(truncated or corrupt?): {error}"
                        ) from None
        self._check_finite(features, boxes, rows)
        return torch.from_numpy(features), torch.from_numpy(boxes)

    def _check_finite(self, features: np.ndarray, boxes: np.ndarray, rows: np.ndarray) -> None:
        """Refuse NaN or Inf (bad input, not a divergence), naming the first image."""
        for name, values in ((self.feature_name, features), (self.box_name, boxes)):
            bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
            if bad.any():
                first = int(rows[int(np.flatnonzero(bad)[0])])
                raise ValueError(
                    f"{self.source}: dataset {name!r} holds NaN or Inf at {len(set(rows[bad].tolist()))} image(s), the first image "
                    f"id {self.image_id(first)} (row {first}); re-extract the features or drop those images"
                )

    def load(self) -> ImageFeatures:
        """Every image in memory, padded to the file's most boxes."""
        parts = [self.read(np.arange(start, min(start + 1024, self.images)), pad_to=self.max_boxes)
                 for start in range(0, self.images, 1024)]
        return ImageFeatures(torch.cat([f for f, _ in parts]), torch.cat([b for _, b in parts]), self.rows, self.source)


#: a features file of at most this many bytes as float32, padded, is read whole by
#: :func:`served`; a larger one is read per batch (``POLYFUSE_IN_MEMORY_FEATURE_BYTES``)
IN_MEMORY_BYTES = int(os.environ.get("POLYFUSE_IN_MEMORY_FEATURE_BYTES", str(512 << 20)))


def served(features: RegionFeatures) -> RegionFeatures | ImageFeatures:
    """What batches read: a file of at most :data:`IN_MEMORY_BYTES` (float32, padded to its
    most boxes) whole in memory, gathered from there (a small set, as easy-VQA); a larger
    one as it is, read per batch."""
    if features.images * features.max_boxes * features.dim * 4 > IN_MEMORY_BYTES:
        return features
    return features.load()


def load_image_features(path: str | Path) -> ImageFeatures:
    """A file written by ``polyfuse extract images``, in memory."""
    return RegionFeatures(path).load()


def is_bottom_up(path: str | Path) -> bool:
    """Whether the HDF5 file ``path`` is in a ban-vqa layout (an ``image_features``
    dataset, read by :func:`load_bottom_up_features` with its image-id index) rather than
    the ``features`` of ``polyfuse extract images``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"feature file {path} does not exist")
    with open_h5(path) as handle:
        return "image_features" in handle and "features" not in handle


def _read_index(path: Path) -> dict[int, int]:
    if path.suffix == ".json":
        raw = read_json(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object {{image id: row}}")
        try:
            return {int(k): int(v) for k, v in raw.items()}
        except (TypeError, ValueError):
            bad = next(k for k, v in raw.items() if not (str(k).lstrip("-").isdigit() and isinstance(v, int)))
            raise ValueError(f"{path}: image id {bad!r} maps to {raw[bad]!r}; expected integer ids and rows") from None
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or not {"image_id", "row"} <= set(reader.fieldnames):
                raise ValueError(f"{path}: expected CSV columns image_id,row")
            return {int(r["image_id"]): int(r["row"]) for r in reader}
    raise ValueError(
        f"{path}: the image index must be JSON or CSV; pickles are never unpickled "
        "(see polyfuse.data.formats.features for a one-line conversion of a trusted pickle)"
    )


#: Datasets that may hold the boxes of a bottom-up file, in the order they are looked for:
#: ban-vqa's normalised ``spatial_features``, the name ``spatials`` (read before ban-vqa's
#: was), the pixel boxes ``image_bb``.
BOX_DATASETS = ("spatial_features", "spatials", "image_bb")


def _image_boxes(pos_boxes: np.ndarray, rows: dict[int, int], total: int, h5_path: Path) -> dict[int, tuple[int, int]]:
    """[start, end) of the boxes of each ``pos_boxes`` row that the index uses, checked:
    inside the R stacked boxes, not empty, in increasing order without overlap (as
    ban-vqa's converter writes them)."""
    if pos_boxes.ndim != 2 or pos_boxes.shape[1] != 2 or not np.issubdtype(pos_boxes.dtype, np.integer):
        raise ValueError(f"{h5_path}: pos_boxes must be an (images, 2) integer array, got {pos_boxes.shape} {pos_boxes.dtype}")
    image_of_row = {row: image_id for image_id, row in sorted(rows.items(), reverse=True)}
    spans = {row: (int(pos_boxes[row, 0]), int(pos_boxes[row, 1])) for row in sorted(image_of_row)}
    previous_end, previous_row = 0, None
    for row, (start, end) in spans.items():
        where = f"{h5_path}: pos_boxes row {row} (image id {image_of_row[row]}) is [{start}, {end})"
        if not 0 <= start < end <= total:
            raise ValueError(f"{where}; expected 0 <= start < end <= {total}, the rows of image_features")
        if start < previous_end:
            raise ValueError(
                f"{where}, which overlaps or precedes row {previous_row} ending at {previous_end}; "
                "the boxes of each image must follow those of the row before"
            )
        previous_end, previous_row = end, row
    return spans


def load_bottom_up_features(h5_path: str | Path, index_path: str | Path) -> ImageFeatures:
    """Bottom-up region features in either ban-vqa layout (module docstring) with an id
    index as JSON/CSV, in memory (:class:`RegionFeatures` read whole).

    Boxes come from the first of :data:`BOX_DATASETS` in the file: the normalised
    ``spatial_features`` / ``spatials`` (first four columns) or, if neither is present,
    the pixel boxes ``image_bb`` as stored. With ``pos_boxes`` (the adaptive layout)
    each image's boxes are padded with zeros to the largest count in the file.
    """
    return RegionFeatures(h5_path, index_path).load()
