"""The ranking figure of the ranking task types (``polyfuse plot ranking``): for one text
query, the top videos of a split as frame thumbnails with their scores. The scores come
from the task (:meth:`polyfuse.tasks.ranking.spec.RankingSpec.query_scores`); the
ranking, the clips' frames and the lines that say the ranking are here, the drawing in
:mod:`polyfuse.figures.retrieval`.

Shapes: ``N`` videos of the split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.data.sources import is_synthetic

__all__ = ["RankedVideo", "check_query", "draw_ranking", "rank_by_scores", "ranking_figure"]


@dataclass(frozen=True)
class RankedVideo:
    rank: int  # 1 = best
    video_id: str
    score: float
    correct: bool | None  # None when the query is not one of the corpus's captions


def rank_by_scores(scores: Tensor, video_ids: Sequence[str], *, correct_id: str | None = None) -> list[RankedVideo]:
    """Every video of ``video_ids`` by its (N,) score, best first; ties keep the given order
    (``torch.topk`` on CPU is not promised stable, so a stable sort)."""
    if scores.shape != (len(video_ids),):
        raise ValueError(f"{tuple(scores.shape)} scores for {len(video_ids)} videos")
    order = torch.sort(scores, descending=True, stable=True).indices
    return [RankedVideo(rank + 1, video_ids[i], float(scores[i]),
                        None if correct_id is None else video_ids[i] == correct_id)
            for rank, i in enumerate(order.tolist())]


def draw_ranking(ranking: list[RankedVideo], clips: dict[str, Path], query: str, out: str | Path) -> Path:
    """One PNG: the middle frame of each ranked video's clip, titled with rank, id and
    score (green frame: a correct video, red: a wrong one, when known); drawn by
    :func:`polyfuse.figures.retrieval.draw_ranking_frames`."""
    from polyfuse.extract.decode import sample_frames
    from polyfuse.figures.retrieval import draw_ranking_frames

    missing = [r.video_id for r in ranking if r.video_id not in clips]
    if missing:
        raise FileNotFoundError(f"no clip for video(s) {missing} in the clips folder")
    frames = [sample_frames(clips[ranked.video_id], 1)[0] for ranked in ranking]  # the middle frames, (H, W, 3)
    return draw_ranking_frames(ranking, frames, query, out)


def check_query(query: str | None, caption: int | None, top: int) -> None:
    """One query, free text (not blank) or a caption's index, and at least one video to show."""
    if (query is None) == (caption is None):
        raise ValueError("plot ranking takes one query: --query TEXT or --caption INDEX")
    if query is not None and not query.strip():
        raise ValueError("--query is empty")
    if top < 1:
        raise ValueError(f"--top must be at least 1, got {top}")


def ranking_figure(corpus: RetrievalCorpus, scores_of: Callable[[str, int | None], Tensor], out: Path, *,
                   split: str, query: str | None, caption: int | None, top: int, clips: str | None,
                   source: str | None) -> tuple[list[Path], list[str]]:
    """The figure of the ``top`` videos of ``corpus`` (the ``split``) for a free-text
    ``query`` or its ``caption``-th caption (whose video is marked correct), and the lines
    that say the ranking. ``scores_of(text, caption)``: the (N,) scores of the split's
    videos; ``clips``: the folder of the clips (default: ``<source>/clips``)."""
    from polyfuse.extract.video import video_paths_of_folder

    check_query(query, caption, top)
    if caption is not None:
        if not 0 <= caption < len(corpus.captions):
            raise ValueError(f"--caption {caption}: the {split} split has captions 0 to {len(corpus.captions) - 1}")
        text, correct = corpus.captions[caption], corpus.caption_video[caption]
    else:
        text, correct = query, None
    if not clips and (not source or is_synthetic(source)):
        raise ValueError("--clips is needed: the corpus is not an MSVD folder (give the folder of the clips, "
                         "one file per video id)")
    paths = video_paths_of_folder(clips or Path(source) / "clips")
    everything = rank_by_scores(scores_of(text, caption), corpus.video_ids, correct_id=correct)
    ranking = everything[:top]
    written = draw_ranking(ranking, paths, text, out)
    lines = [f"query: {text}"]
    lines += [f"{r.rank}. {r.video_id}  {r.score:.3f}{'  correct' if r.correct else ''}" for r in ranking]
    if correct is not None:
        found = next(r for r in everything if r.correct)
        lines.append(f"the caption's video, {correct}, is at rank {found.rank} of {len(everything)} "
                     f"(score {found.score:.3f})")
    return [written], lines
