"""A small synthetic set in the exact files of the Flickr30k Entities release, with region
features in ban-vqa's adaptive HDF5 layout, so that the grounding pipeline (parsing,
targets, training, evaluation, prediction) runs without downloading anything.

Written under ``folder``:

- ``Sentences/<image id>.txt``: five captions per image, phrases marked as the release
  marks them (``[/EN#<entity id>/<type> words]``), one scene phrase per caption whose
  entity has no box (``<nobndbox>``) and so is skipped by the task;
- ``Annotations/<image id>.xml``: ``<annotation>`` with ``<filename>``, ``<size>``
  (``<width>``, ``<height>``, ``<depth>``) and one ``<object>`` per box (``<name>``: the
  entity id, ``<bndbox>``: ``xmin ymin xmax ymax`` in pixels), or with ``<nobndbox>1``;
- ``train.txt``, ``val.txt``, ``test.txt``: the image ids of each split (60/20/20 %);
- ``features.hdf5`` and ``features_imgid2idx.json``: 10 to 16 candidate boxes per
  image (:class:`~polyfuse.data.formats.bottom_up_tsv.AdaptiveWriter`).

Learnable: each object kind (:data:`KINDS`: man, dog, shirt, ...) has a random +-1
prototype of ``feature_dim`` values; a phrase's noun is its kind. Near each ground-truth
box the image has one or two jittered candidate boxes (IoU >= 0.5) whose features are
the kind's prototype plus N(0, 0.3^2) noise; the other candidates are random boxes of
noise. About one entity in eight gets no candidate near it (the upper bound is then
below 1, as a detector's is). Everything follows from ``seed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import h5py
import numpy as np

from polyfuse.data.formats.bottom_up_tsv import AdaptiveWriter, default_index_path

__all__ = ["KINDS", "SyntheticFlickr30k", "write_flickr30k_like"]

#: (entity type, noun) of the object kinds
KINDS = (("people", "man"), ("people", "woman"), ("animals", "dog"), ("clothing", "shirt"), ("vehicles", "bike"),
         ("other", "ball"), ("instruments", "guitar"), ("animals", "horse"))
_ADJECTIVES = ("small", "big", "red", "old", "young", "white", "black", "happy")
_VERBS = ("is next to", "is looking at", "stands near", "plays with", "walks past")
_SCENES = ("the street", "a park", "the beach", "a field")


@dataclass(frozen=True)
class SyntheticFlickr30k:
    """What :func:`write_flickr30k_like` wrote."""

    folder: Path  # the release's folder (data.grounding.entities)
    features: Path  # the adaptive HDF5 (data.grounding.features)
    index: Path  # its image-id index (data.grounding.features_index)
    splits: dict[str, list[int]]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _random_box(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    w, h = rng.uniform(0.2, 0.5) * width, rng.uniform(0.2, 0.5) * height
    x, y = rng.uniform(1, width - w - 1), rng.uniform(1, height - h - 1)
    return np.round(np.array([x, y, x + w, y + h]))


def _near(rng: np.random.Generator, box: np.ndarray, width: int, height: int) -> np.ndarray:
    """A jittered copy of ``box`` at IoU >= 0.55 with it, inside the image."""
    while True:
        w, h = box[2] - box[0], box[3] - box[1]
        shift = rng.uniform(-0.08, 0.08, size=4) * np.array([w, h, w, h])
        near = np.clip(box + shift, [0, 0, 0, 0], [width - 1, height - 1, width - 1, height - 1])
        if near[2] > near[0] and near[3] > near[1] and _iou(near, box) >= 0.55:
            return near


def _phrase(rng: np.random.Generator, entity: int, kind: int, capital: bool) -> str:
    words = [str(rng.choice(["a", "the", "one"]))]
    if rng.random() < 0.5:
        words.append(str(rng.choice(_ADJECTIVES)))
    words.append(KINDS[kind][1])
    if capital:
        words[0] = words[0].capitalize()
    return f"[/EN#{entity}/{KINDS[kind][0]} {' '.join(words)}]"


def _annotation(image_id: int, width: int, height: int, objects: list[tuple[int, np.ndarray | None]]) -> str:
    lines = ["<annotation>", f"<filename>{image_id}.jpg</filename>",
             f"<size><width>{width}</width><height>{height}</height><depth>3</depth></size>"]
    for entity, box in objects:
        if box is None:
            lines.append(f"<object><name>{entity}</name><nobndbox>1</nobndbox><scene>1</scene></object>")
        else:
            corners = "".join(f"<{t}>{int(v)}</{t}>" for t, v in zip(("xmin", "ymin", "xmax", "ymax"), box, strict=True))
            lines.append(f"<object><name>{escape(str(entity))}</name><bndbox>{corners}</bndbox></object>")
    return "\n".join([*lines, "</annotation>"]) + "\n"


def write_flickr30k_like(folder: str | Path, *, images: int = 60, seed: int = 0, feature_dim: int = 32,
                         captions: int = 5) -> SyntheticFlickr30k:
    """Write the synthetic set of the module docstring (``images`` images, at least 3)
    under ``folder`` and return its paths."""
    if images < 3:
        raise ValueError(f"write_flickr30k_like: images must be at least 3 (one per split), got {images}")
    folder = Path(folder)
    (folder / "Sentences").mkdir(parents=True, exist_ok=True)
    (folder / "Annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    prototypes = rng.choice([-1.0, 1.0], size=(len(KINDS), feature_dim))
    image_ids = sorted(int(i) for i in rng.choice(np.arange(1_000_000, 9_000_000), size=images, replace=False))
    features_path = folder / "features.hdf5"
    entity_id = 10_000
    with h5py.File(features_path, "w") as handle:
        writer = AdaptiveWriter(handle, feature_dim)
        for line, image_id in enumerate(image_ids):
            width, height = int(rng.integers(300, 501)), int(rng.integers(300, 501))
            kinds = rng.choice(len(KINDS), size=int(rng.integers(2, 4)), replace=False).tolist()
            objects: list[tuple[int, np.ndarray | None]] = []
            boxes, rows = [], []
            entities = []
            for kind in kinds:
                entity_id += 1
                truths = [_random_box(rng, width, height) for _ in range(2 if rng.random() < 0.2 else 1)]
                for truth in truths:
                    objects.append((entity_id, truth))
                    if rng.random() < 0.125:
                        continue  # the detector missed it
                    for _ in range(int(rng.integers(1, 3))):
                        boxes.append(_near(rng, truth, width, height))
                        rows.append(prototypes[kind] + rng.normal(scale=0.3, size=feature_dim))
                entities.append((entity_id, kind))
            entity_id += 1
            scene = entity_id
            objects.append((scene, None))
            total = int(rng.integers(10, 17))
            while len(boxes) < total:
                boxes.append(_random_box(rng, width, height))
                rows.append(rng.normal(scale=1.0, size=feature_dim))
            order = rng.permutation(len(boxes))
            writer.add(image_id, line, width, height, np.asarray(boxes, dtype=np.float32)[order],
                       np.asarray(rows, dtype=np.float32)[order])
            (folder / "Annotations" / f"{image_id}.xml").write_text(_annotation(image_id, width, height, objects))
            sentences = []
            for _ in range(captions):
                chosen = [entities[i] for i in rng.permutation(len(entities))[:2]]
                first = _phrase(rng, *chosen[0], capital=True)
                second = _phrase(rng, *chosen[1], capital=False)
                where = f"[/EN#{scene}/scene {rng.choice(_SCENES)}]"
                sentences.append(f"{first} {rng.choice(_VERBS)} {second} in {where} .")
            (folder / "Sentences" / f"{image_id}.txt").write_text("\n".join(sentences) + "\n")
        writer.flush({"layout": "ban-vqa adaptive (polyfuse synthetic flickr30k)"})
        index = writer.index()
    index_path = default_index_path(features_path)
    index_path.write_text(json.dumps(index))
    shuffled = [image_ids[i] for i in rng.permutation(images)]
    val = max(1, images // 5)
    splits = {"train": sorted(shuffled[: images - 2 * val]), "val": sorted(shuffled[images - 2 * val : images - val]),
              "test": sorted(shuffled[images - val :])}
    for name, ids in splits.items():
        (folder / f"{name}.txt").write_text("".join(f"{i}\n" for i in ids))
    return SyntheticFlickr30k(folder, features_path, index_path, splits)
