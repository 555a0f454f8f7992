"""The retrieval figure: the top-k videos of one text query as frame thumbnails, titled
with rank, id and score."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.figures.common import pyplot, save_figure

__all__ = ["draw_ranking_frames"]


def draw_ranking_frames(ranking: Sequence[Any], frames: Sequence[Any], query: str, out: str | Path) -> Path:
    """One PNG: ``frames[i]`` ((H, W, 3) image) for ``ranking[i]``, titled with its rank,
    id and score, framed in green when the video is correct, red when wrong and not at
    all when unknown.

    ``ranking``: objects with ``rank``, ``video_id``, ``score`` and ``correct`` (True,
    False or None), such as :class:`polyfuse.tasks.ranking.figure.RankedVideo`.
    """
    if not ranking:
        raise ValueError("draw_ranking_frames: the ranking is empty")
    if len(frames) != len(ranking):
        raise ValueError(f"draw_ranking_frames: {len(frames)} frames for {len(ranking)} ranked videos")
    plt = pyplot()
    figure, axes = plt.subplots(1, len(ranking), figsize=(3.0 * len(ranking), 3.0), squeeze=False)
    for axis, ranked, frame in zip(axes[0], ranking, frames, strict=True):
        axis.imshow(np.asarray(frame))
        axis.set_xticks([])
        axis.set_yticks([])
        axis.set_title(f"{ranked.rank}. {ranked.video_id}\nscore {ranked.score:.3f}", fontsize=8)
        if ranked.correct is not None:
            for spine in axis.spines.values():
                spine.set_edgecolor("green" if ranked.correct else "red")
                spine.set_linewidth(3)
    figure.suptitle(f"query: {query}", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out, dpi=100)
