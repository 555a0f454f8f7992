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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from polyfuse.data.arrays import open_h5
from polyfuse.data.formats.jsonfile import read_json

__all__ = ["BOX_DATASETS", "ImageFeatures", "is_bottom_up", "load_bottom_up_features", "load_image_features"]


@dataclass
class ImageFeatures:
    """Features and boxes of a set of images, with the row of each image id."""

    features: Tensor  # (N, O, d) float32
    boxes: Tensor  # (N, O, 4) float32
    rows: dict[int, int]
    source: str

    def select(self, image_ids: Sequence[int], *, what: str = "questions") -> tuple[Tensor, Tensor]:
        """(features, boxes) of ``image_ids`` in order; an id without features is an error."""
        missing = sorted({i for i in image_ids if i not in self.rows})
        if missing:
            raise ValueError(
                f"{self.source}: no features for image id(s) {missing[:10]}"
                f"{' ...' if len(missing) > 10 else ''} ({len(missing)} missing) used by the {what}"
            )
        index = torch.tensor([self.rows[i] for i in image_ids], dtype=torch.long)
        return self.features[index], self.boxes[index]


def _dataset(handle: h5py.File, name: str, path: Path) -> np.ndarray:
    if name not in handle:
        raise ValueError(f"{path}: no dataset {name!r} (found {sorted(handle)})")
    return handle[name][:]


def _check_finite(values: np.ndarray, name: str, path: Path, row_id, unit: str = "image") -> None:
    """Refuse NaN or Inf features (bad input, not a divergence), naming the first image
    (``unit``: what a row of ``values`` is, an image or a box of the adaptive layout)."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        where = f"(row {row})" if unit == "image" else f"({unit} row {row})"
        raise ValueError(
            f"{path}: dataset {name!r} holds NaN or Inf at {int(bad.sum())} {unit}(s), the first image id "
            f"{row_id(row)} {where}; re-extract the features or drop those images"
        )


def load_image_features(path: str | Path) -> ImageFeatures:
    """Read a file written by ``polyfuse extract images``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"feature file {path} does not exist")
    with open_h5(path) as handle:  # no external storage or links, sizes bounded
        features = _dataset(handle, "features", path)
        boxes = _dataset(handle, "boxes", path)
        ids = _dataset(handle, "image_ids", path)
    if not (len(features) == len(boxes) == len(ids)):
        raise ValueError(f"{path}: features, boxes and image_ids have {len(features)}, {len(boxes)}, {len(ids)} rows")
    for name, values in (("features", features), ("boxes", boxes)):
        _check_finite(values, name, path, lambda row: int(ids[row]))
    rows = {int(image_id): row for row, image_id in enumerate(ids.tolist())}
    return ImageFeatures(
        torch.from_numpy(features.astype(np.float32)), torch.from_numpy(boxes.astype(np.float32)), rows, str(path)
    )


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


def _pad_images(
    features: np.ndarray, boxes: np.ndarray, spans: dict[int, tuple[int, int]], images: int
) -> tuple[np.ndarray, np.ndarray]:
    """(images, O, d) features and (images, O, 4) boxes from the stacked rows, O the
    largest box count; missing boxes and unused rows are zero (masked by the models)."""
    most = max(end - start for start, end in spans.values())
    padded_features = np.zeros((images, most, features.shape[1]), dtype=np.float32)
    padded_boxes = np.zeros((images, most, 4), dtype=np.float32)
    for row, (start, end) in spans.items():
        padded_features[row, : end - start] = features[start:end]
        padded_boxes[row, : end - start] = boxes[start:end]
    return padded_features, padded_boxes


def load_bottom_up_features(h5_path: str | Path, index_path: str | Path) -> ImageFeatures:
    """Bottom-up region features in either ban-vqa layout (module docstring) with an id
    index as JSON/CSV.

    Boxes come from the first of :data:`BOX_DATASETS` in the file: the normalised
    ``spatial_features`` / ``spatials`` (first four columns) or, if neither is present,
    the pixel boxes ``image_bb`` as stored. With ``pos_boxes`` (the adaptive layout)
    each image's boxes are padded with zeros to the largest count in the file.

    Raises:
        ValueError: a missing dataset, shapes that do not match, an index row outside
            the images, ``pos_boxes`` spans outside the stacked boxes, empty, overlapping
            or out of order, NaN or Inf in the features or boxes.
    """
    h5_path, index_path = Path(h5_path), Path(index_path)
    for path in (h5_path, index_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
    rows = _read_index(index_path)
    with open_h5(h5_path) as handle:
        features = _dataset(handle, "image_features", h5_path)
        name = next((n for n in BOX_DATASETS if n in handle), BOX_DATASETS[0])
        boxes = _dataset(handle, name, h5_path)
        pos_boxes = _dataset(handle, "pos_boxes", h5_path) if "pos_boxes" in handle else None
    layout, wanted = ("adaptive", 2) if pos_boxes is not None else ("fixed", 3)
    if features.ndim != wanted or boxes.ndim != wanted or boxes.shape[:-1] != features.shape[:-1] or boxes.shape[-1] < 4:
        expected = "(R, d) and (R, 4 or 6), R boxes" if pos_boxes is not None else "(N, O, d) and (N, O, 4 or 6)"
        raise ValueError(
            f"{h5_path}: image_features {features.shape} and {name} {boxes.shape} do not match the {layout} "
            f"layout: expected {expected}"
        )
    images = len(pos_boxes) if pos_boxes is not None else len(features)
    bad = [k for k, v in rows.items() if not 0 <= v < images]
    if bad:
        what = "rows of pos_boxes" if pos_boxes is not None else "images"
        raise ValueError(f"{index_path}: rows of image ids {bad[:10]} lie outside [0, {images}), the {what} of {h5_path}")
    boxes = boxes[..., :4]
    id_of_row = {v: k for k, v in rows.items()}
    row_id = lambda row: id_of_row.get(row, "(none)")  # noqa: E731
    if pos_boxes is not None:
        spans = _image_boxes(pos_boxes, rows, len(features), h5_path)
        # a box row's image: the span holding it (only asked when a value is bad)
        row_id = lambda box: next((id_of_row[r] for r, (a, b) in spans.items() if a <= box < b), "(none)")  # noqa: E731
    for dataset, values in (("image_features", features), (name, boxes)):
        _check_finite(values, dataset, h5_path, row_id, "image" if pos_boxes is None else "box")
    if pos_boxes is not None:
        features, boxes = _pad_images(features, boxes, spans, images)
    return ImageFeatures(
        torch.from_numpy(features.astype(np.float32)), torch.from_numpy(boxes.astype(np.float32)), rows, str(h5_path)
    )
