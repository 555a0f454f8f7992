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

As the source of a ``task.type: retrieval`` run (``retrieval.source:
synthetic:videos=10000,...`` with ``retrieval.text: bow``) the videos are split 80 / 10 / 10 in order (train, validation, test), and
:func:`recall_bounds` gives two reference levels for the test recalls besides chance:
that of a model which ranks by the caption perfectly, and that of one which knows each
expert's event but not the relation (what a fusion that pools every expert separately
can reach at best).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import torch

from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus
from polyfuse.data.synthetic import parse_synthetic_options

__all__ = [
    "SYNTHETIC_RETRIEVAL_DEFAULTS",
    "BagOfWordsEncoder",
    "bag_of_words",
    "make_synthetic_retrieval",
    "parse_synthetic_retrieval",
    "recall_bounds",
    "synthetic_retrieval_split",
]

#: Options of ``synthetic:key=value,...`` for retrieval (the arguments of make_synthetic_retrieval).
SYNTHETIC_RETRIEVAL_DEFAULTS = {"videos": 1000, "experts": 2, "steps": 8, "dim": 16, "events": 4,
                                "noise": 0.1, "seed": 0}


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


class BagOfWordsEncoder:
    """The text encoder of ``--text bow``: word counts over a fixed vocabulary, in the
    interface of the sentence encoders (``encoder(captions).sentence``, (C, V))."""

    def __init__(self, vocabulary: list[str]) -> None:
        if not vocabulary:
            raise ValueError("BagOfWordsEncoder needs a non-empty vocabulary")
        self.vocabulary = list(vocabulary)

    def __call__(self, captions: list[str]) -> SimpleNamespace:
        return SimpleNamespace(sentence=bag_of_words(list(captions), self.vocabulary))


def parse_synthetic_retrieval(spec: str) -> dict[str, int | float]:
    """The generator options of ``synthetic`` or ``synthetic:videos=N,experts=m,...``."""
    if spec.partition(":")[0] != "synthetic":
        raise ValueError(f"not a synthetic source: {spec!r}")
    return parse_synthetic_options(spec, SYNTHETIC_RETRIEVAL_DEFAULTS, _retrieval_value)


def _retrieval_value(key: str, text: str) -> int | float:
    kind = type(SYNTHETIC_RETRIEVAL_DEFAULTS[key])
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"synthetic option {key} needs a {kind.__name__}, got {text!r}") from None


def synthetic_retrieval_split(spec: str) -> tuple[RetrievalCorpus, dict[str, list[str]]]:
    """The corpus of a ``synthetic:...`` spec and its 80 / 10 / 10 split, in video order."""
    options = parse_synthetic_retrieval(spec)
    if options["videos"] < 10:
        raise ValueError(f"synthetic retrieval needs at least 10 videos (one per split and more), "
                         f"got videos={options['videos']}")
    corpus, _ = make_synthetic_retrieval(
        int(options["videos"]), num_experts=int(options["experts"]), steps=int(options["steps"]),
        dim=int(options["dim"]), events=int(options["events"]), noise=float(options["noise"]),
        seed=int(options["seed"]),
    )
    ids = corpus.video_ids
    train, val = int(0.8 * len(ids)), int(0.1 * len(ids))
    return corpus, {"train": ids[:train], "val": ids[train : train + val], "test": ids[train + val :]}


def recall_bounds(corpus: RetrievalCorpus, ks: tuple[int, ...] = (1, 5, 10)) -> dict[str, float]:
    """Text-to-video R@K (percent) of two reference rankers on a synthetic corpus.

    ``caption_R@K``: scores that depend only on whether a video's caption equals the
    query (the best any model can do: the n videos with that caption tie, and the
    correct one is in the top K with probability min(1, K / n) when the tie is broken
    at random). ``events_R@K``: scores that know every expert's event but not the
    relation word (the last word), so that the n' videos with the same events tie:
    min(1, K / n'). Each is the mean over the captions used as queries.
    """
    words = [caption.split() for caption in corpus.captions]
    full = Counter(" ".join(w) for w in words)
    events = Counter(" ".join(w[:-1]) for w in words)
    out = {}
    for k in ks:
        out[f"caption_R@{k}"] = 100 * sum(min(1.0, k / full[" ".join(w)]) for w in words) / len(words)
        out[f"events_R@{k}"] = 100 * sum(min(1.0, k / events[" ".join(w[:-1])]) for w in words) / len(words)
    return out
