"""VQA from pictures: 64 px pictures whose square's colour answers the questions of
:mod:`tests.tiny.vqa`, their question files, and a fast stand-in for EfficientNet-Lite0
(``polyfuse.extract.images.load_backbone``) with its interface."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tests.tiny.vqa import QUESTIONS

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220)}


class PooledColours(torch.nn.Module):
    """``extract_features``: (B, 3, S, S) -> (B, 1280, S/32, S/32), as EfficientNet-Lite0's:
    each 32 px cell's mean colour through a fixed random map to 1,280 values."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(3, 1280, generator=torch.Generator().manual_seed(0)))

    def extract_features(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bchw,cd->bdhw", F.avg_pool2d(batch, 32), self.weight)


def picture(path: Path, image_id: int) -> None:
    """A 64 px picture: a red (odd id) or blue (even id) square on white, placed by the id."""
    pixels = np.full((64, 64, 3), 255, dtype=np.uint8)
    corner = 4 * (image_id % 5)
    pixels[corner : corner + 36, corner : corner + 36] = COLOURS["red" if image_id % 2 else "blue"]
    Image.fromarray(pixels).save(path)


def write_question_files(folder: Path, split: str, image_ids) -> None:
    """``<split>_questions.json`` and ``<split>_annotations.json``: the two questions of
    :data:`~tests.tiny.vqa.QUESTIONS` about each picture, ten humans agreeing on the answer."""
    questions, annotations = [], []
    for image_id in image_ids:
        red = image_id % 2 == 1
        for k, (text, kind) in enumerate(QUESTIONS):
            answer = ("red" if red else "blue") if kind == "color" else ("yes" if red else "no")
            questions.append({"question_id": 10 * image_id + k, "image_id": image_id, "question": text})
            annotations.append({"question_id": 10 * image_id + k, "image_id": image_id, "answers": [answer] * 10,
                                "answer_type": "other", "question_type": kind})  # fmt: skip
    (folder / f"{split}_questions.json").write_text(json.dumps({"questions": questions}))
    (folder / f"{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))
