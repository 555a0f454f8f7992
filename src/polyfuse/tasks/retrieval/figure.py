"""The scores of the retrieval ranking figure (``polyfuse plot ranking``): one text query
against every video of a split, through the model's two embeddings; the ranking and the
drawing are those of every ranking task (:mod:`polyfuse.tasks.ranking.figure`).

Shapes: ``N`` videos of the split, ``D`` the joint embedding size, ``d_t`` the text
encoder's size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.tasks.ranking.data import video_batch

__all__ = ["embed_videos", "video_scores"]


@torch.no_grad()
def embed_videos(model: RetrievalModel, corpus: RetrievalCorpus, batch_size: int = 64) -> Tensor:
    """(N, D) video embeddings of a corpus (with the model's extra columns, if any), ``batch_size`` videos at a time."""
    videos = []
    for start in range(0, len(corpus.video_ids), batch_size):
        batch = video_batch(corpus, torch.arange(start, min(start + batch_size, len(corpus.video_ids))))
        videos.append(model.embed_videos(batch["features"], batch["masks"], batch["present"]))
    return torch.cat(videos)


@torch.no_grad()
def video_scores(model: RetrievalModel, corpus: RetrievalCorpus, query_vector: Tensor) -> Tensor:
    """(N,) scores of one (1, d_t) sentence vector against every video of ``corpus``, in eval mode."""
    model.eval()
    return model.similarity(model.embed_texts(query_vector), embed_videos(model, corpus))[0]
