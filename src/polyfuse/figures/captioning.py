"""The captioning figure: one video's frames, its generated and reference captions, and
MAF's attention over time in every modality for each generated word (HOCA Eq. 19), with
the modality weights beta (Eq. 20)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polyfuse.figures.common import pyplot, save_figure

__all__ = ["draw_caption_attention"]


def draw_caption_attention(
    found: Mapping[str, Any], images: Any, out: str | Path, *, references: int = 3, frames: int = 8,
    no_frames: str = "(no frames)",
) -> Path:
    """Write the figure to ``out``.

    Args:
        found: what :func:`polyfuse.tasks.captioning.figure.caption_attention` returns:
            ``video``, ``split``, ``caption``, ``words`` (W generated words),
            ``attention`` (one (W, T_m) array per modality), ``modality_weights``
            (W, M), ``modalities`` (M names), ``references`` (captions),
            ``frame_stride``.
        images: (F, H, W, 3) frames of the clip shown across the top row, or None
            (``no_frames`` is written there instead).
        references: how many reference captions to show.
        frames: the columns of the layout when ``images`` is None (else F).
    """
    words, modalities = list(found["words"]), list(found["modalities"])
    if len(found["attention"]) != len(modalities):
        raise ValueError(f"draw_caption_attention: {len(found['attention'])} attention maps for modalities {modalities}")
    for name, attention in zip(modalities, found["attention"], strict=True):
        if len(attention) != len(words):
            raise ValueError(f"draw_caption_attention: {name} attention has {len(attention)} rows for {len(words)} words")
    plt = pyplot()
    frames = len(images) if images is not None else frames
    count = len(modalities)
    heights = [1.6, 0.9] + [max(1.2, 0.28 * len(words))] * (count + 1)
    figure = plt.figure(figsize=(11, sum(heights) + 0.6))
    grid = figure.add_gridspec(len(heights), frames, height_ratios=heights, hspace=0.9)
    if images is not None:
        for k in range(frames):
            axis = figure.add_subplot(grid[0, k])
            axis.imshow(images[k])
            axis.axis("off")
    else:
        axis = figure.add_subplot(grid[0, :])
        axis.text(0.5, 0.5, no_frames, ha="center", va="center")
        axis.axis("off")
    text = figure.add_subplot(grid[1, :])
    text.axis("off")
    lines = [f"generated: {found['caption']}"] + [f"reference: {r}" for r in found["references"][:references]]
    text.text(0.0, 1.0, "\n".join(textwrap.shorten(line, 130) for line in lines), va="top", family="monospace", fontsize=9)
    for m, name in enumerate(modalities):
        axis = figure.add_subplot(grid[2 + m, :])
        attention = found["attention"][m]
        image = axis.imshow(attention, aspect="auto", cmap="viridis", vmin=0.0)
        axis.set_yticks(range(len(words)), words, fontsize=8)
        axis.set_xticks(range(attention.shape[1]))
        axis.tick_params(axis="x", labelsize=7)
        axis.set_xlabel(f"{name}: feature step (every {found['frame_stride']}th of the file's rows)", fontsize=8)
        axis.set_title(f"{name}: attention over time per generated word (Eq. 19)", fontsize=9)
        figure.colorbar(image, ax=axis, fraction=0.02, pad=0.01)
    axis = figure.add_subplot(grid[2 + count, : max(2, frames // 2)])
    image = axis.imshow(found["modality_weights"], aspect="auto", cmap="magma", vmin=0.0, vmax=1.0)
    axis.set_yticks(range(len(words)), words, fontsize=8)
    axis.set_xticks(range(count), modalities, fontsize=8)
    axis.set_title("modality weights beta per word (Eq. 20)", fontsize=9)
    figure.colorbar(image, ax=axis, fraction=0.05, pad=0.02)
    figure.suptitle(f"{found['split']} video {found['video']}", fontsize=10)
    return save_figure(figure, out, dpi=100, bbox_inches="tight")
