"""VQA figures: BAN's attention over the image grid and the question words; the bars
of a VQA comparison over seeds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.figures.common import pyplot, save_figure

__all__ = ["draw_vqa_attention", "draw_vqa_summary"]


def draw_vqa_summary(summary: Sequence[Mapping[str, Any]], types: Sequence[str], out: str | Path) -> Path:
    """Bars of test accuracy (%) per model, overall and per answer type of ``types``, with
    ± std error bars. ``summary``: rows of :func:`polyfuse.engine.compare.summarise`
    (``model``, ``acc_mean``, ``acc_std``, ``acc/<type>_mean``, ...)."""
    if not summary:
        raise ValueError("draw_vqa_summary: no rows to draw")
    plt = pyplot()
    models = [str(row["model"]) for row in summary]
    keys = ["acc", *(f"acc/{t}" for t in types)]
    figure, axis = plt.subplots(figsize=(1.6 + 1.3 * len(models), 3.2))
    width = 0.8 / len(keys)
    low = 100.0
    for offset, key in enumerate(keys):
        means = [100 * row.get(f"{key}_mean", float("nan")) for row in summary]
        errors = [100 * row.get(f"{key}_std", 0.0) for row in summary]
        low = min(low, *means)
        label = "overall" if key == "acc" else key.split("/", 1)[1]
        axis.bar([i + offset * width for i in range(len(models))], means, width, yerr=errors, label=label, capsize=2)
    axis.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(models))], models)
    axis.set_ylabel("VQA accuracy (%)")
    axis.set_ylim(max(0.0, low - 10), 100)
    axis.legend(fontsize=7, ncol=len(keys), loc="lower right")
    figure.tight_layout()
    return save_figure(figure, out, dpi=120)


def draw_vqa_attention(
    attention: Any, words: Sequence[str], grid: tuple[int, int], image: Any, out: str | Path, *, title: str = ""
) -> Path:
    """One row per glimpse: the image, each glimpse's bilinear attention summed over the
    words and drawn over the image grid, and the attention summed over the grid cells
    per question word (BAN's A_g, paper Eq. 8).

    Args:
        attention: (G, O, L) maps of one question, O = rows * columns grid cells.
        words: the L words (padding included, shown as ``-``).
        grid: (rows, columns) of the image grid.
        image: (H, W, 3) array of the image, or None.
    """
    attention = np.asarray(attention, dtype=float)
    if attention.ndim != 3:
        raise ValueError(f"draw_vqa_attention: attention must be (glimpses, objects, words), got shape {attention.shape}")
    glimpses, objects, length = attention.shape
    rows, columns = grid
    if rows * columns != objects:
        raise ValueError(f"draw_vqa_attention: grid {rows} x {columns} does not hold {objects} objects")
    if len(words) != length:
        raise ValueError(f"draw_vqa_attention: {len(words)} words for attention over {length} positions")
    plt = pyplot()
    figure, axes = plt.subplots(glimpses, 2, figsize=(7.5, 2.6 * glimpses), squeeze=False)
    for g in range(glimpses):
        over_image = attention[g].sum(axis=1).reshape(rows, columns)
        left, right = axes[g]
        if image is not None:
            left.imshow(image, extent=(0, 1, 1, 0))
        shown = left.imshow(over_image, extent=(0, 1, 1, 0), alpha=0.55 if image is not None else 1.0, cmap="magma")
        figure.colorbar(shown, ax=left, fraction=0.046)
        left.set_title(f"glimpse {g + 1}: attention over the image grid", fontsize=8)
        left.set_xticks([])
        left.set_yticks([])
        right.barh(range(length), attention[g].sum(axis=0), color="tab:blue")
        right.set_yticks(range(length), list(words), fontsize=7)
        right.invert_yaxis()
        right.set_title(f"glimpse {g + 1}: attention per word", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out, dpi=110)
