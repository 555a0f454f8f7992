"""Image features in HDF5: the file ``polyfuse extract images`` writes, and bottom-up
region features in the layout the ban-vqa code reads.

polyfuse layout: ``features`` (N, O, d), ``boxes`` (N, O, 4) as (x1, y1, x2, y2) and
``image_ids`` (N,) in one file (the last row of an id wins).

ban-vqa layout (``tools/detection_features_converter.py``): ``image_features``
(N, O, d), ``spatials`` (N, O, 6) as (x1, y1, x2, y2, w, h) normalised by the image
size (or ``image_bb`` in pixels), and a *pickle* mapping image id -> row. A pickle can
run code when read, so it is never opened: give the index as JSON
(``{"<image id>": row}``) or CSV (``image_id,row``); to convert one you trust:
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

__all__ = ["ImageFeatures", "load_bottom_up_features", "load_image_features"]


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


def _check_finite(values: np.ndarray, name: str, path: Path, row_id) -> None:
    """Refuse NaN or Inf features (bad input, not a divergence), naming the first image."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{path}: dataset {name!r} holds NaN or Inf at {int(bad.sum())} image(s), the first image id "
            f"{row_id(row)} (row {row}); re-extract the features or drop those images"
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


def load_bottom_up_features(h5_path: str | Path, index_path: str | Path) -> ImageFeatures:
    """Bottom-up region features (ban-vqa's ``{split}36.hdf5`` with an id index as JSON/CSV).

    Boxes come from ``spatials`` (already normalised; first four columns) or, if only
    ``image_bb`` is present, from the pixel boxes as stored.
    """
    h5_path, index_path = Path(h5_path), Path(index_path)
    for path in (h5_path, index_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
    rows = _read_index(index_path)
    with open_h5(h5_path) as handle:
        features = _dataset(handle, "image_features", h5_path)
        name = "spatials" if "spatials" in handle else "image_bb"
        boxes = _dataset(handle, name, h5_path)[..., :4]
    if features.ndim != 3 or boxes.shape[:2] != features.shape[:2]:
        raise ValueError(
            f"{h5_path}: image_features {features.shape} and {name} {boxes.shape} do not match (N, O, ...)"
        )
    bad = [k for k, v in rows.items() if not 0 <= v < len(features)]
    if bad:
        raise ValueError(f"{index_path}: rows of image ids {bad[:10]} lie outside [0, {len(features)})")
    id_of_row = {v: k for k, v in rows.items()}
    for dataset, values in (("image_features", features), (name, boxes)):
        _check_finite(values, dataset, h5_path, lambda row: id_of_row.get(row, "(none)"))
    return ImageFeatures(
        torch.from_numpy(features.astype(np.float32)), torch.from_numpy(boxes.astype(np.float32)), rows, str(h5_path)
    )
