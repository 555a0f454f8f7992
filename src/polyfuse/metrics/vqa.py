"""The VQA accuracy of Antol et al. (ICCV 2015) as the official VQA 2.0 evaluation computes it.

The answer rules of the official script (whitespace, :func:`normalize_answer` only when
the human answers differ, the mean over the ten leave-one-out subsets of nine humans of
``min(#matching / 3, 1)``) live in :mod:`polyfuse.text`, which the data use too (the
answer vocabulary, the soft targets, each candidate answer's accuracy); they are
re-exported here as the functional side of the metric.

:class:`VQAScore` accumulates the accuracy over batches, overall and per answer type
(yes/no, number, other), each the mean of its questions' accuracies as the official
script computes them. It does not apply the rules to strings at every batch: the data
give each question its candidate answers and their accuracies, computed once with
:func:`vqa_accuracy` (:func:`polyfuse.tasks.vqa.data.answer_table`), and the metric
looks the predicted answer up among them.

:func:`soft_score` is ``min(#humans that gave the answer / 3, 1)``, the
``min_third`` rule of ``data.vqa.soft_score``. It is not
the default training target, which is ban-vqa's 0.3 / 0.6 / 0.9 / 1 (``ban_vqa``); the
VQA task computes its targets with :func:`polyfuse.data.formats.vqa.soft_score_of`, and
nothing in the package calls this function (a public helper, tested on its own).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

# The official answer rules, shared with the data; part of this module's API.
from polyfuse.text import normalize_answer, process_digit_article, process_punctuation, vqa_accuracy

__all__ = [
    "VQAScore",
    "normalize_answer",
    "process_digit_article",
    "process_punctuation",
    "soft_score",
    "vqa_accuracy",
]


def soft_score(count: int | float) -> float:
    """min(count / 3, 1) for an answer given by ``count`` humans: ``data.vqa.soft_score:
    min_third``'s target (the default, ``ban_vqa``, is 0.3 / 0.6 / 0.9 / 1; module docstring)."""
    if count < 0:
        raise ValueError(f"soft_score: count must be >= 0, got {count}")
    return min(count / 3.0, 1.0)


class VQAScore(Metric):
    """Official VQA accuracy accumulated over batches, overall and per answer type.

    Shapes: ``B`` questions of a batch, ``K`` candidate answers of a question, ``T``
    type names.

    ``update(predicted, answer_ids, answer_scores, types)``: predicted (B,) answer
    indices; answer_ids (B, K) long and answer_scores (B, K), the accuracy
    (:func:`vqa_accuracy`) of each candidate answer of the question, -1 pads; an answer
    outside the candidates scores 0. types (B,) long in [0, T) (-1: a type unseen in
    training, counted overall only). ``compute()`` gives ``acc`` and ``acc/<type name>``
    (types with questions only) as fractions in [0, 1].

    The states are sums (float64), added across processes under DDP.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, type_names: Sequence[str]) -> None:
        super().__init__()
        self.type_names = list(type_names)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("type_total", torch.zeros(len(self.type_names), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("type_count", torch.zeros(len(self.type_names), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predicted: Tensor, answer_ids: Tensor, answer_scores: Tensor, types: Tensor) -> None:
        batch = predicted.shape[0] if predicted.dim() == 1 else None
        if batch is None or answer_ids.dim() != 2 or answer_ids.shape[0] != batch:
            raise ValueError(
                f"VQAScore.update: predicted {tuple(predicted.shape)} must be (B,) and answer_ids "
                f"{tuple(answer_ids.shape)} (B, K)"
            )
        if answer_scores.shape != answer_ids.shape or types.shape != (batch,):
            raise ValueError(
                f"VQAScore.update: answer_scores {tuple(answer_scores.shape)} must be {tuple(answer_ids.shape)} "
                f"and types {tuple(types.shape)} ({batch},)"
            )
        if types.numel() and int(types.max()) >= len(self.type_names):
            raise ValueError(f"VQAScore.update: type index {int(types.max())} but {len(self.type_names)} type names")
        hit = (answer_ids == predicted.unsqueeze(1)) & (answer_ids >= 0)  # (B, K)
        scores = (answer_scores * hit).sum(dim=1).double()  # (B,)
        self.total += scores.sum()
        self.count += scores.numel()
        known = types >= 0
        self.type_total.index_add_(0, types[known], scores[known])
        self.type_count.index_add_(0, types[known], torch.ones_like(scores[known]))

    def compute(self) -> dict[str, Tensor]:
        values = {"acc": (self.total / self.count.clamp_min(1)).float()}
        for i, name in enumerate(self.type_names):
            if self.type_count[i] > 0:
                values[f"acc/{name}"] = (self.type_total[i] / self.type_count[i]).float()
        return values
