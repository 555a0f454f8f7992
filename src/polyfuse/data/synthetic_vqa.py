"""A synthetic set shaped like VQA 2.0, in the official files: questions and annotations
JSON (:mod:`polyfuse.data.formats.vqa`), region features as the bottom-up-attention TSV
and/or ban-vqa's adaptive HDF5 with its JSON index
(:mod:`polyfuse.data.formats.bottom_up_tsv`), so that the whole VQA 2.0 pipeline
(import, training, evaluation) can be exercised at scale without downloading anything.

Each image has ``min_boxes`` to ``max_boxes`` regions of ``feature_dim`` float32
features, N(0, 1) noise. A few object kinds (:data:`OBJECTS`: dog, cat, car, ...) each
have a random +-1 prototype; an image holds some of them, each in 1 to 3 of its boxes,
with a colour (``answers``, default :data:`COLORS`) whose own prototype is added to the
same boxes. The questions ask, for one object kind, ``is there a dog in the picture?``
(yes / no), ``how many dogs are there?`` (0 to 3) or ``what color is the dog?`` (a colour
of an object the image holds): the answer is in the features of the boxes the question
names, so a model that fuses the question with the regions can beat chance (and one
that ignores the image cannot beat the answer prior). Each question has ten human
answers, about 90 % of them the right one and the others another answer of the same
type; ``multiple_choice_answer`` is the most frequent.

Image ids are distinct COCO-like integers (below 600,000 as COCO's, or 10 x the images
when more), question ids ``image_id * 1000 + k`` as VQA 2.0's. Everything follows from
``seed``; images are written one at a time, so memory stays bounded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from polyfuse.atomic import atomic_temp_path, atomic_write_text
from polyfuse.data.formats.bottom_up_tsv import LAYOUT, AdaptiveWriter, default_index_path

__all__ = ["COLORS", "OBJECTS", "write_vqa2_like"]

#: the object kinds the questions ask about
OBJECTS = ("dog", "cat", "car", "person", "bus", "bird", "horse", "chair")
#: the default answers of ``what color`` questions
COLORS = ("red", "blue", "green", "yellow", "white", "black")
_NUMBERS = ("0", "1", "2", "3")
_YES_NO = ("yes", "no")
_AGREEMENT = 0.9  # probability that a human answer is the right one
_INFO = {
    "description": "polyfuse synthetic set in the VQA 2.0 format (not real data)",
    "version": "2.0",
    "year": 2017,
    "contributor": "polyfuse.data.synthetic_vqa",
    "date_created": "2017-04-26 17:00:44",
}
_LICENSE = {
    "name": "Creative Commons Attribution 4.0 International License",
    "url": "http://creativecommons.org/licenses/by/4.0/",
}


def _image_ids(rng: np.random.Generator, total: int) -> list[int]:
    high = max(600_000, 10 * total)
    return [int(i) + 1 for i in rng.choice(high, size=total, replace=False)]


def _image(
    rng: np.random.Generator,
    prototypes: np.ndarray,
    colors: np.ndarray,
    feature_dim: int,
    min_boxes: int,
    max_boxes: int,
) -> tuple[int, int, np.ndarray, np.ndarray, dict[int, tuple[int, int]]]:
    """(w, h, boxes (n, 4), features (n, d), {object: (count, colour)}) of one image."""
    n = int(rng.integers(min_boxes, max_boxes + 1))
    w, h = int(rng.integers(320, 641)), int(rng.integers(240, 641))
    x1 = rng.uniform(0, w * 0.8, n).astype(np.float32)
    y1 = rng.uniform(0, h * 0.8, n).astype(np.float32)
    x2 = np.minimum(x1 + rng.uniform(8, w * 0.6, n).astype(np.float32), np.float32(w - 1))
    y2 = np.minimum(y1 + rng.uniform(8, h * 0.6, n).astype(np.float32), np.float32(h - 1))
    boxes = np.stack([x1, y1, x2, y2], axis=1)
    features = rng.standard_normal((n, feature_dim), dtype=np.float32)
    present = np.flatnonzero(rng.random(len(prototypes)) < 0.4)
    if len(present) == 0:
        present = rng.integers(0, len(prototypes), 1)
    counts = rng.integers(1, 4, len(present))
    hues = rng.integers(0, len(colors), len(present))
    order = rng.permutation(n)
    objects: dict[int, tuple[int, int]] = {}
    used = 0
    for kind, count, hue in zip(present.tolist(), counts.tolist(), hues.tolist(), strict=True):
        count = min(count, n - used)
        if count == 0:
            break
        where = order[used : used + count]
        used += count
        features[where] += prototypes[kind] + colors[hue]
        objects[kind] = (count, hue)
    return w, h, boxes, features, objects


def _question(
    rng: np.random.Generator, objects: dict[int, tuple[int, int]], answers: Sequence[str]
) -> tuple[str, str, str, str, tuple[str, ...]]:
    """(question, question_type, answer_type, right answer, the answers of its type)."""
    kind = int(rng.integers(0, 3))
    if kind == 2:  # what color: about an object the image holds
        held = sorted(objects)
        thing = held[int(rng.integers(0, len(held)))]
        return (
            f"What color is the {OBJECTS[thing]}?",
            "what color is the",
            "other",
            answers[objects[thing][1]],
            tuple(answers),
        )
    thing = int(rng.integers(0, len(OBJECTS)))
    count = objects.get(thing, (0, 0))[0]
    if kind == 0:
        return (
            f"Is there a {OBJECTS[thing]} in the picture?",
            "is there a",
            "yes/no",
            "yes" if count else "no",
            _YES_NO,
        )
    return f"How many {OBJECTS[thing]}s are there?", "how many", "number", str(count), _NUMBERS


def _human_answers(
    rng: np.random.Generator, right: str, choices: Sequence[str]
) -> tuple[list[dict], str]:
    texts = [
        right if rng.random() < _AGREEMENT else choices[int(rng.integers(0, len(choices)))]
        for _ in range(10)
    ]
    confidence = rng.choice(["yes", "maybe", "no"], size=10, p=[0.85, 0.1, 0.05])
    entries = [
        {"answer": t, "answer_confidence": str(c), "answer_id": k + 1}
        for k, (t, c) in enumerate(zip(texts, confidence, strict=True))
    ]
    return entries, Counter(texts).most_common(1)[0][0]


def _tsv_line(image_id: int, w: int, h: int, boxes: np.ndarray, features: np.ndarray) -> bytes:
    return (
        b"\t".join(
            [
                str(image_id).encode(),
                str(w).encode(),
                str(h).encode(),
                str(len(boxes)).encode(),
                base64.b64encode(boxes.astype("<f4").tobytes()),
                base64.b64encode(features.astype("<f4").tobytes()),
            ]
        )
        + b"\n"
    )


def write_vqa2_like(
    folder: str | Path,
    *,
    images: int | Mapping[str, int],
    questions_per_image: int = 5,
    answers: Sequence[str] = COLORS,
    feature_dim: int = 2048,
    min_boxes: int = 10,
    max_boxes: int = 100,
    seed: int = 0,
    splits: Sequence[str] = ("train", "val"),
    formats: Sequence[str] = ("tsv", "hdf5"),
) -> dict[str, dict[str, Path]]:
    """Write the synthetic set (module docstring) into ``folder``; for each split
    ``v2_OpenEnded_mscoco_{split}2014_questions.json``, ``v2_mscoco_{split}2014_annotations.json``
    and, per ``formats``, ``{split}.tsv`` (bottom-up release format) and ``{split}.hdf5``
    with ``{split}_imgid2idx.json`` (adaptive ban-vqa layout, the same numbers as the TSV).

    ``images``: images per split (an int, or ``{split: images}``); ``answers``: the
    colours answering ``what color`` questions (at least 2). Returns
    ``{split: {"questions", "annotations", "tsv", "hdf5", "index": path}}`` (the paths written).
    """
    formats = tuple(formats)
    unknown = sorted(set(formats) - {"tsv", "hdf5"})
    if unknown or not formats:
        raise ValueError(f"formats {list(formats)}: expected one or both of tsv, hdf5")
    per_split = {s: (images[s] if isinstance(images, Mapping) else images) for s in splits}
    if not splits or any(int(n) < 1 for n in per_split.values()):
        raise ValueError(
            f"images per split {per_split}: expected at least 1 image in each of at least one split"
        )
    if not 1 <= min_boxes <= max_boxes:
        raise ValueError(
            f"min_boxes {min_boxes}, max_boxes {max_boxes}: expected 1 <= min_boxes <= max_boxes"
        )
    if feature_dim < 1 or not 1 <= questions_per_image < 1000:
        raise ValueError(
            f"feature_dim {feature_dim}, questions_per_image {questions_per_image}: expected "
            "feature_dim >= 1 and 1 <= questions_per_image < 1000"
        )
    answers = [str(a) for a in answers]
    if len(set(answers)) < 2:
        raise ValueError(f"answers {answers}: expected at least 2 distinct colours")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    prototypes = rng.choice(
        np.array([-1.0, 1.0], dtype=np.float32), size=(len(OBJECTS), feature_dim)
    )
    colors = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(len(answers), feature_dim))
    ids = _image_ids(rng, sum(per_split.values()))
    written: dict[str, dict[str, Path]] = {}
    first = 0
    for split in splits:
        split_ids = sorted(ids[first : first + per_split[split]])
        first += per_split[split]
        written[split] = _write_split(
            folder,
            split,
            split_ids,
            rng,
            prototypes,
            colors,
            answers,
            feature_dim,
            min_boxes,
            max_boxes,
            questions_per_image,
            formats,
        )
    return written


def _write_split(
    folder: Path,
    split: str,
    image_ids: Sequence[int],
    rng: np.random.Generator,
    prototypes: np.ndarray,
    colors: np.ndarray,
    answers: Sequence[str],
    feature_dim: int,
    min_boxes: int,
    max_boxes: int,
    questions_per_image: int,
    formats: Sequence[str],
) -> dict[str, Path]:
    paths = {
        "questions": folder / f"v2_OpenEnded_mscoco_{split}2014_questions.json",
        "annotations": folder / f"v2_mscoco_{split}2014_annotations.json",
    }
    if "tsv" in formats:
        paths["tsv"] = folder / f"{split}.tsv"
    if "hdf5" in formats:
        paths["hdf5"] = folder / f"{split}.hdf5"
        paths["index"] = default_index_path(paths["hdf5"])
    questions: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:  # files closed, then renamed from their temporary names
        tsv = handle = writer = None
        if "tsv" in paths:
            tsv = stack.enter_context(
                stack.enter_context(atomic_temp_path(paths["tsv"])).open("wb")
            )
        if "hdf5" in paths:
            handle = stack.enter_context(
                h5py.File(stack.enter_context(atomic_temp_path(paths["hdf5"])), "w")
            )
            handle.attrs.update(
                {
                    "layout": LAYOUT,
                    "feature_dim": feature_dim,
                    "complete": False,
                    "source_name": f"{split}.tsv",
                }
            )
            writer = AdaptiveWriter(handle, feature_dim)
        done = last_start = 0
        last_hash = ""
        for number, image_id in enumerate(image_ids, start=1):
            w, h, boxes, features, objects = _image(
                rng, prototypes, colors, feature_dim, min_boxes, max_boxes
            )
            line = _tsv_line(image_id, w, h, boxes, features)
            last_start, done = done, done + len(line)
            if tsv is not None:
                tsv.write(line)
            if writer is not None:
                last_hash = hashlib.sha256(line).hexdigest()
                writer.add(image_id, number, w, h, boxes, features)
                if writer.full():
                    writer.flush()
            for k in range(questions_per_image):
                text, question_type, answer_type, right, choices = _question(rng, objects, answers)
                human, most = _human_answers(rng, right, choices)
                question_id = image_id * 1000 + k
                questions.append(
                    {"image_id": image_id, "question": text, "question_id": question_id}
                )
                annotations.append(
                    {
                        "question_type": question_type,
                        "multiple_choice_answer": most,
                        "answers": human,
                        "image_id": image_id,
                        "answer_type": answer_type,
                        "question_id": question_id,
                    }
                )
        if writer is not None:  # the attributes of a finished import of the TSV
            writer.flush(
                {
                    "lines_done": len(image_ids),
                    "bytes_done": done,
                    "source_bytes": done,
                    "last_line_start": last_start,
                    "last_line_sha256": last_hash,
                    "complete": True,
                }
            )
            atomic_write_text(paths["index"], json.dumps(writer.index()))
    atomic_write_text(
        paths["questions"],
        json.dumps(
            {
                "info": _INFO,
                "task_type": "Open-Ended",
                "data_type": "mscoco",
                "data_subtype": f"{split}2014",
                "license": _LICENSE,
                "questions": questions,
            }
        ),
    )
    atomic_write_text(
        paths["annotations"],
        json.dumps(
            {
                "info": _INFO,
                "license": _LICENSE,
                "data_subtype": f"{split}2014",
                "annotations": annotations,
            }
        ),
    )
    return paths
