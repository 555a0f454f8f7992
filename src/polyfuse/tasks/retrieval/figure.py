"""The retrieval figure: for one text query, the top-k videos as frame thumbnails with
their scores (``polyfuse retrieval figure``): the ranking and the clips' frames here,
the drawing in :mod:`polyfuse.figures.retrieval`.

Shapes: ``N`` videos of the split, ``D`` the joint embedding size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.nn.models.retrieval import RetrievalModel

__all__ = ["RankedVideo", "draw_ranking", "embed_corpus", "rank_videos"]


@torch.no_grad()
def embed_corpus(model: RetrievalModel, corpus: RetrievalCorpus, text_vectors: Tensor, batch_size: int = 64):
    """(C, D) caption embeddings and (N, D) video embeddings of a corpus."""
    model.eval()
    experts = list(corpus.experts.values())
    videos = []
    for start in range(0, len(corpus.video_ids), batch_size):
        rows = torch.arange(start, min(start + batch_size, len(corpus.video_ids)))
        videos.append(model.embed_videos([e.features[rows] for e in experts], [e.mask[rows] for e in experts],
                                         torch.stack([e.present[rows] for e in experts], dim=1)))
    return model.embed_texts(text_vectors), torch.cat(videos)


@dataclass(frozen=True)
class RankedVideo:
    rank: int  # 1 = best
    video_id: str
    score: float
    correct: bool | None  # None when the query is not one of the corpus's captions


def rank_videos(
    model: RetrievalModel, corpus: RetrievalCorpus, query_vector: Tensor, top: int, *, correct_id: str | None = None
) -> list[RankedVideo]:
    """The ``top`` videos of ``corpus`` for one (1, d_t) sentence vector, best first; ties
    keep the corpus order (``torch.topk`` on CPU is not promised stable, so a stable sort)."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    query, videos = embed_corpus(model, corpus, query_vector)  # (1, D), (N, D)
    scores = (query @ videos.T)[0]  # (N,)
    order = torch.sort(scores, descending=True, stable=True).indices[: min(top, len(corpus.video_ids))]
    return [
        RankedVideo(rank + 1, corpus.video_ids[i], float(scores[i]), None if correct_id is None else corpus.video_ids[i] == correct_id)
        for rank, i in enumerate(order.tolist())
    ]


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
