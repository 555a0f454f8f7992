"""Synthetic text-video retrieval at scale: N videos x m experts with planted events.

Each expert j has ``events`` prototype vectors in R^d (unit norm). In each video,
expert j shows one event a_j at one time step t_j (its prototype plus noise); every
other step is noise. The caption names the event of every expert (word ``x{j}e{a}``)
and one relation word: ``together`` when the events of experts 0 and 1 happen at the
same step, ``apart`` otherwise. The relation is a property of the two experts
*jointly* (their time steps), which no expert shows on its own: a fusion that pools
each expert separately cannot tell ``together`` from ``apart``. With E events per
expert there are E^m * 2 distinct captions, so for N >> E^m many videos share a
caption and retrieval recall is bounded accordingly.

Text vectors are bags of words (one count per vocabulary word), so no text encoder is
needed and nothing is downloaded.
"""

from __future__ import annotations

import torch

from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus

__all__ = ["bag_of_words", "make_synthetic_retrieval"]


def make_synthetic_retrieval(
    num_videos: int,
    *,
    num_experts: int = 2,
    steps: int = 8,
    dim: int = 16,
    events: int = 4,
    noise: float = 0.1,
    seed: int = 0,
) -> tuple[RetrievalCorpus, list[str]]:
    """The corpus (one caption per video, ids ``vid00000``...) and its vocabulary."""
    if num_videos < 2 or num_experts < 2 or steps < 2 or events < 1 or dim < 1:
        raise ValueError("need num_videos >= 2, num_experts >= 2, steps >= 2, events >= 1, dim >= 1")
    g = torch.Generator().manual_seed(seed)
    ids = [f"vid{i:05d}" for i in range(num_videos)]
    event_of = torch.randint(events, (num_videos, num_experts), generator=g)
    step_of = torch.randint(steps, (num_videos, num_experts), generator=g)
    experts = {}
    for j in range(num_experts):
        prototypes = torch.nn.functional.normalize(torch.randn(events, dim, generator=g), dim=-1)
        features = noise * torch.randn(num_videos, steps, dim, generator=g)
        features[torch.arange(num_videos), step_of[:, j]] += prototypes[event_of[:, j]]
        experts[f"expert{j}"] = ExpertFeatures(
            f"expert{j}", ids, features, torch.ones(num_videos, steps, dtype=torch.bool),
            torch.ones(num_videos, dtype=torch.bool),
        )
    together = step_of[:, 0] == step_of[:, 1]
    captions = [
        " ".join([f"x{j}e{int(event_of[i, j])}" for j in range(num_experts)]
                 + ["together" if together[i] else "apart"])
        for i in range(num_videos)
    ]
    vocabulary = [f"x{j}e{a}" for j in range(num_experts) for a in range(events)] + ["together", "apart"]
    corpus = RetrievalCorpus.build(experts, {v: [c] for v, c in zip(ids, captions, strict=True)}, ids)
    return corpus, vocabulary


def bag_of_words(captions: list[str], vocabulary: list[str]) -> torch.Tensor:
    """(C, V) word counts; a word outside the vocabulary is an error naming the caption."""
    index = {w: i for i, w in enumerate(vocabulary)}
    out = torch.zeros(len(captions), len(vocabulary))
    for c, caption in enumerate(captions):
        for word in caption.split():
            if word not in index:
                raise ValueError(f"caption {c} ({caption!r}) has the unknown word {word!r}")
            out[c, index[word]] += 1
    return out
