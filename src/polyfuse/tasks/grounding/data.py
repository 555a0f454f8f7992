"""Flickr30k Entities data for the engine (``task.type: grounding``): captions with their
phrases and ground-truth boxes, region features, the splits and their batches.

The release (github.com/BryanPlummer/flickr30k_entities): ``Sentences/<image id>.txt``
(five captions, phrases marked ``[/EN#<entity id>/<type> words]``),
``Annotations/<image id>.xml`` (boxes per entity id, in pixels, and the image size) and
``train.txt`` / ``val.txt`` / ``test.txt`` (one image id per line). Region features are
an HDF5 file of a layout :class:`~polyfuse.data.formats.features.RegionFeatures` reads,
keyed by image id (ban-vqa's Flickr30k features are its adaptive layout).

An item is one caption with the phrases that have boxes. Skipped, and counted in the
notes a run prints: phrases whose entity has no box in the XML (``<nobndbox>``, scene
and non-visual entities, entity 0), as ban-vqa's ``_load_flickr30k`` skips them;
phrases that end beyond ``max_length`` words; captions left without a phrase.

Boxes: the features' box dataset (ban-vqa's ``spatial_features``, or the ``boxes`` of
``polyfuse extract images``) holds (x1, y1, x2, y2) divided by the image size; they are
multiplied by the XML's width and height to pixels. A bottom-up file with only
``image_bb`` holds pixels already. The targets of a phrase are the candidate boxes with
IoU >= 0.5 with one of its ground-truth boxes (:func:`~polyfuse.metrics.grounding.box_targets`).

Legend for shapes: ``B`` captions of a batch, ``L`` words, ``P`` phrases (the batch's
most), ``O`` boxes (the batch's most), ``d_v`` region feature size. A batch is a dict:
``tokens`` (B, L) long, ``image`` (B, O, d_v), ``boxes`` (B, O, 4) in pixels,
``positions`` (B, P) long (each phrase's last word; 0 at padding), ``phrase_mask`` (B, P)
bool, ``targets`` (B, P, O) float (1 at boxes with IoU >= 0.5) and ``row`` (B,).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from polyfuse.data.datamodule import SplitBatchesDataModule
from polyfuse.data.formats.features import ImageFeatures, RegionFeatures, is_bottom_up, served
from polyfuse.data.formats.flickr30k import parse_boxes, parse_sentence
from polyfuse.data.formats.vqa import UNKNOWN_WORD
from polyfuse.metrics.grounding import box_targets

__all__ = [
    "GroundingData", "GroundingDataModule", "GroundingItem", "GroundingPhrase", "GroundingSplit",
    "build_grounding_data", "encode_words", "read_image_ids", "read_items", "word_vocabulary",
]

SPLITS = ("train", "val", "test")

@dataclass(frozen=True, slots=True)
class GroundingPhrase:
    """A phrase with boxes: its words, entity, types, last word and ground truth (n, 4) in pixels."""

    text: str
    entity_id: int
    types: tuple[str, ...]
    position: int
    truth: tuple[tuple[float, float, float, float], ...]


@dataclass(frozen=True, slots=True)
class GroundingItem:
    """One caption: its image, its line in ``Sentences/<image id>.txt`` (0-based), its
    words (markup removed), its phrases with boxes and the image size (width, height)."""

    image_id: int
    caption: int
    words: tuple[str, ...]
    phrases: tuple[GroundingPhrase, ...]
    size: tuple[int, int]


def read_image_ids(path: str | Path) -> list[int]:
    """The image ids of a split file, one per line (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Flickr30k Entities split file {path} does not exist")
    ids = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.strip()
        if not text:
            continue
        if not text.isdigit():
            raise ValueError(f"{path} line {number}: {text!r} is not an image id")
        ids.append(int(text))
    return ids


def read_items(entities: str | Path, image_ids: Sequence[int], *, max_length: int,
               notes: Counter | None = None) -> list[GroundingItem]:
    """The captions of ``image_ids`` with the phrases that have boxes (module docstring),
    in image then caption order; ``notes`` counts what was skipped."""
    entities = Path(entities)
    notes = Counter() if notes is None else notes
    items = []
    for image_id in image_ids:
        sentences = entities / "Sentences" / f"{image_id}.txt"
        if not sentences.is_file():
            raise FileNotFoundError(f"Flickr30k Entities sentences {sentences} (image id {image_id}) do not exist")
        annotation = entities / "Annotations" / f"{image_id}.xml"
        boxes, size = parse_boxes(annotation)
        for entity, truth in boxes.items():
            if not all(math.isfinite(v) for box in truth for v in box):
                raise ValueError(f"{annotation}: entity {entity} has a box with NaN or Inf")
        if size[0] <= 0 or size[1] <= 0:
            raise ValueError(f"{annotation}: image size {size} is not positive")
        lines = sentences.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                words, phrases = parse_sentence(line)
            except ValueError as error:
                raise ValueError(f"{sentences} line {number + 1}: {error}") from None
            kept = []
            for phrase in phrases:
                notes["phrases"] += 1
                if phrase.entity_id not in boxes:
                    notes["phrases without a box"] += 1
                    continue
                position = phrase.first_word + len(phrase.text.split()) - 1
                if position >= max_length:
                    notes[f"phrases ending beyond max_length {max_length}"] += 1
                    continue
                kept.append(GroundingPhrase(phrase.text, phrase.entity_id, phrase.types, position,
                                            tuple(boxes[phrase.entity_id])))
            if not kept:
                notes["captions without a phrase with boxes"] += 1
                continue
            items.append(GroundingItem(image_id, number, tuple(words), tuple(kept), size))
    return items


def word_vocabulary(items: Sequence[GroundingItem], *, min_count: int = 1) -> list[str]:
    """Lower-cased caption words seen at least ``min_count`` times, most frequent first
    (ties alphabetical), then :data:`~polyfuse.data.formats.vqa.UNKNOWN_WORD`."""
    counts = Counter(word.lower() for item in items for word in item.words)
    counts.pop(UNKNOWN_WORD, None)
    return [*sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w)), UNKNOWN_WORD]


def encode_words(items: Sequence[GroundingItem], words: Sequence[str], max_length: int) -> Tensor:
    """(N, max_length) long: one token per caption word (lower-cased; unknown words
    :data:`UNKNOWN_WORD`), so that a phrase's word position is its token position;
    padded at the end with ``len(words)``. ban-vqa's tokenizer also drops commas and
    splits ``'s``, which moves its tokens away from the positions its
    ``find_sublist`` computed on the words; one token per word keeps them aligned."""
    index = {w: i for i, w in enumerate(words)}
    unknown = index[UNKNOWN_WORD]
    tokens = torch.full((len(items), max_length), len(words), dtype=torch.long)
    for row, item in enumerate(items):
        ids = [index.get(w.lower(), unknown) for w in item.words[:max_length]]
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return tokens


@dataclass
class GroundingSplit:
    """One split: its items, their tokens and the features of their images (read per batch)."""

    items: list[GroundingItem]
    tokens: Tensor  # (N, L) long
    image_rows: Tensor  # (N,) long
    features: RegionFeatures | ImageFeatures
    pixel_boxes: bool  # the feature file's boxes are in pixels (image_bb) rather than divided by the size
    merge: str = "any"

    def __len__(self) -> int:
        return len(self.items)

    def batch(self, index: Tensor) -> dict[str, Tensor]:
        items = [self.items[i] for i in index.tolist()]
        image, boxes = self.features.read(self.image_rows[index].numpy())
        if not self.pixel_boxes:
            scale = torch.tensor([[w, h, w, h] for w, h in (item.size for item in items)], dtype=boxes.dtype)
            boxes = boxes * scale[:, None, :]
        phrases = max(len(item.phrases) for item in items)
        positions = torch.zeros(len(items), phrases, dtype=torch.long)
        mask = torch.zeros(len(items), phrases, dtype=torch.bool)
        targets = torch.zeros(len(items), phrases, boxes.shape[1])
        for b, item in enumerate(items):
            for p, phrase in enumerate(item.phrases):
                positions[b, p], mask[b, p] = phrase.position, True
                targets[b, p] = box_targets(boxes[b], torch.tensor(phrase.truth), merge=self.merge).float()
        return {"tokens": self.tokens[index], "image": image, "boxes": boxes, "positions": positions,
                "phrase_mask": mask, "targets": targets, "row": index}


@dataclass
class GroundingData:
    """What a grounding run trains and tests on (see :func:`build_grounding_data`)."""

    splits: dict[str, GroundingSplit]
    words: list[str]
    image_dim: int
    word_vectors: Tensor | None = None
    notes: list[str] = field(default_factory=list)


def _features(section: Mapping[str, Any], split: str) -> tuple[RegionFeatures, str]:
    """The features file of ``split`` (``<split>_features`` or ``features``) and its key."""
    key = f"{split}_features" if split != "train" and section.get(f"{split}_features") else "features"
    index_key = f"{split}_features_index" if key != "features" else "features_index"
    path, index = section[key], section.get(index_key)
    if index is not None:
        return RegionFeatures(path, index), key
    if is_bottom_up(path):
        raise ValueError(f"data.grounding.{key} {path} is a bottom-up features file of ban-vqa (dataset "
                         f"image_features); set data.grounding.{index_key} to its image-id index (JSON or CSV)")
    return RegionFeatures(path), key


def build_grounding_data(config: Mapping[str, Any], *, vocabulary: Mapping[str, Any] | None = None,
                         splits: Sequence[str] = SPLITS) -> GroundingData:
    """The splits of a resolved ``task.type: grounding`` configuration; ``vocabulary`` (a
    checkpoint's ``words``) replaces the one built from the training captions."""
    section = config["data"]["grounding"]
    entities = Path(section["entities"])
    max_length = int(section["max_length"])
    counts: Counter = Counter()
    wanted = list(splits) if vocabulary is not None else sorted(set(splits) | {"train"}, key=SPLITS.index)
    items = {}
    for split in wanted:
        split_file = entities / section[f"{split}_split"]
        items[split] = read_items(entities, read_image_ids(split_file), max_length=max_length, notes=counts)
        if not items[split] and split in splits:
            raise ValueError(f"{split_file}: no caption with a phrase that has boxes")
    words = list(vocabulary["words"]) if vocabulary is not None else word_vocabulary(
        items["train"], min_count=int(section["min_word_count"]))
    data = GroundingData({}, words, 0)
    opened: dict[tuple[str, str | None], tuple[Any, bool]] = {}
    for split in splits:
        features, key = _features(section, split)
        ident = (str(features.source), section.get(f"{key}_index"))
        if ident not in opened:
            opened[ident] = (served(features), features.box_name == "image_bb")
        reader, pixels = opened[ident]
        image_ids = [item.image_id for item in items[split]]
        reader.check_ids(image_ids, f"{split} captions of {entities}")
        data.splits[split] = GroundingSplit(
            items[split], encode_words(items[split], words, max_length),
            torch.tensor([reader.rows[i] for i in image_ids], dtype=torch.long), reader, pixels, section["match"],
        )  # fmt: skip
        data.image_dim = int(reader.dim)
    if counts:
        skipped = {k: v for k, v in counts.items() if k != "phrases"}
        data.notes.append(f"{counts['phrases']} phrases read; skipped: " + (
            ", ".join(f"{v} {k}" for k, v in skipped.items()) if skipped else "none"))
    glove = config["model"]["grounding"]["glove"] if config["model"].get("grounding") else None
    if glove and vocabulary is None:
        from polyfuse.data.formats.glove import load_glove

        data.word_vectors, found = load_glove(glove, words)
        data.notes.append(f"{found} of {len(words)} words found in {Path(glove).name}")
    return data


class GroundingDataModule(SplitBatchesDataModule):
    """Serves the splits of a :class:`GroundingData` as batches of the module docstring
    (:class:`~polyfuse.data.datamodule.SplitBatchesDataModule`)."""
