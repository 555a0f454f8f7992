"""BAN's attention maps of a VQA checkpoint's questions, drawn over their images
(``polyfuse plot attention`` on a VQA checkpoint, through
:meth:`polyfuse.tasks.vqa.spec.VQASpec.attention_figures`): the questions, images and the
model's maps here, the drawing in :func:`polyfuse.figures.vqa.draw_vqa_attention`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from polyfuse.tasks.vqa.data import build_vqa_data

__all__ = ["plot_vqa_checkpoint_attention"]


def plot_vqa_checkpoint_attention(
    task: Any,
    extras: Mapping[str, Any],
    out: str | Path,
    *,
    question_ids: Sequence[int] | None = None,
    sample: int = 0,
    split: str = "test",
    images: str | Path | None = None,
) -> list[Path]:
    """PNG figures of BAN's attention (:func:`polyfuse.figures.vqa.draw_vqa_attention`)
    for questions of ``split``: those of ``question_ids``, or the ``sample``-th. One
    question is written to ``out``; several to ``<out stem>_<question id>.png``. The
    image under the maps comes from ``images`` (a folder of ``<image id>.png|jpg``),
    or for easy-VQA from the installed package."""
    import math

    import numpy as np

    from polyfuse.figures.vqa import draw_vqa_attention
    from polyfuse.text import tokenize_question as tokenize

    config = extras["config"]
    if config["model"]["fusion"] != "ban":
        raise ValueError(f"a {config['model']['fusion']} model has no bilinear attention maps; plot a BAN checkpoint")
    if split == "all":
        raise ValueError("plot attention takes questions of one split: train, val or test")
    if split not in ("train", "val", "test"):
        raise ValueError(f"a VQA checkpoint's attention is drawn for a question of train, val or test, not {split!r}")
    key = split
    part = build_vqa_data(extras["config"], vocabulary=extras["label_info"], splits=[key]).splits[key]
    position = {q.question_id: i for i, q in enumerate(part.questions)}
    if question_ids:
        unknown = [q for q in question_ids if q not in position]
        if unknown:
            raise ValueError(f"question id(s) {unknown} are not in the {key} split")
        rows = [position[q] for q in question_ids]
    else:
        if not 0 <= sample < len(part):
            raise ValueError(f"--sample {sample} is outside the {key} split's {len(part)} questions")
        rows = [sample]
    if images is None and config["data"]["vqa"]["easy_vqa"]:
        from polyfuse.data.formats.easy_vqa import easy_vqa_image_folder

        images = easy_vqa_image_folder("train" if key in ("train", "val") else "test")
    out = Path(out)
    written = []
    for row in rows:
        question = part.questions[row]
        batch = part.batch(torch.tensor([row]))
        with torch.no_grad():
            logits, attention = task(batch)
        length = batch["tokens"].shape[1]
        words = tokenize(question.question)[:length]
        words += ["-"] * (length - len(words))
        objects = batch["image"].shape[1]
        side = math.isqrt(objects)
        grid = (side, side) if side * side == objects else (1, objects)  # regions: one row
        picture = None
        if images is not None:
            from PIL import Image

            found = [p for p in (Path(images) / f"{question.image_id}.{e}" for e in ("png", "jpg", "jpeg")) if p.is_file()]
            if not found:
                raise FileNotFoundError(f"no image {question.image_id}.png|jpg in {images}")
            picture = np.asarray(Image.open(found[0]).convert("RGB"))
        answer = extras["label_info"]["answers"][int(logits.argmax())]
        title = f"{question.question}  predicted: {answer}  (answers: {', '.join(dict.fromkeys(question.answers))})"
        path = out if len(rows) == 1 else out.with_name(f"{out.stem}_{question.question_id}{out.suffix or '.png'}")
        written.append(draw_vqa_attention(attention[0], words, grid, picture, path, title=title))
    return written
