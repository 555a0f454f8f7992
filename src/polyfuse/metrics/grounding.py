"""Phrase grounding: Recall@K of boxes ranked by attention (BAN section 5, Flickr30k Entities).

A phrase counts as grounded at K when one of the K highest-scoring boxes has
IoU >= 0.5 with its ground truth. A phrase with several ground-truth boxes is matched
against each of them (``merge="any"``, the default: BAN section 5.1, "IoU ... with one
of the ground-truth boxes", and ban-vqa's ``utils.get_match_index``), or, with
``merge="union"``, against their union box.

Legend for shapes: ``P`` phrases, ``O`` candidate boxes, ``G`` glimpses, ``L`` words.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from polyfuse.functional.counting import box_iou

__all__ = ["GroundingRecall", "box_targets", "grounding_recall", "phrase_scores", "recall_counts"]


def phrase_scores(attention: Tensor, positions: Sequence[int]) -> Tensor:
    """Box scores of phrases from BAN's attention of one sentence: the attention at
    each phrase's word position summed over glimpses, (G, O, L) -> (P, O)."""
    if attention.dim() != 3:
        raise ValueError(f"phrase_scores: attention must have shape (G, O, L), got {tuple(attention.shape)}")
    length = attention.shape[-1]
    bad = [p for p in positions if not 0 <= p < length]
    if bad:
        raise ValueError(f"phrase_scores: word positions {bad} lie outside [0, {length})")
    return attention.sum(dim=0)[:, list(positions)].T


def grounding_recall(
    scores: Tensor,
    boxes: Tensor,
    truths: Sequence[Tensor],
    *,
    ks: Sequence[int] = (1, 5, 10),
    iou_threshold: float = 0.5,
    merge: str = "any",
) -> dict[int, float]:
    """Recall@K over phrases, as fractions in [0, 1].

    Args:
        scores: (P, O) score of every candidate box for every phrase.
        boxes: (O, 4) candidate boxes shared by the phrases, or (P, O, 4), as (x1, y1, x2, y2).
        truths: P tensors (n_p, 4) of ground-truth boxes, n_p >= 1.
        ks: the K of Recall@K (K larger than O ranks all boxes).
        iou_threshold: the IoU a box needs (0.5).
        merge: ``"any"`` (each of a phrase's ground-truth boxes) or ``"union"`` (one box around them).
    """
    if scores.dim() != 2:
        raise ValueError(f"grounding_recall: scores must have shape (P, O), got {tuple(scores.shape)}")
    phrases, objects = scores.shape
    if boxes.dim() == 2:
        boxes = boxes.unsqueeze(0).expand(phrases, -1, -1)
    if tuple(boxes.shape) != (phrases, objects, 4):
        raise ValueError(f"grounding_recall: boxes must have shape (O, 4) or (P, O, 4) with (P, O) = {(phrases, objects)}")
    if len(truths) != phrases:
        raise ValueError(f"grounding_recall: {len(truths)} ground-truth entries for {phrases} phrases")
    if merge not in ("union", "any"):
        raise ValueError(f"grounding_recall: merge must be 'union' or 'any', got {merge!r}")
    if phrases == 0:
        raise ValueError("grounding_recall: no phrase")
    hits = dict.fromkeys(ks, 0)
    for p in range(phrases):
        truth = truths[p].reshape(-1, 4).to(boxes.dtype)
        if len(truth) == 0:
            raise ValueError(f"grounding_recall: phrase {p} has no ground-truth box")
        if merge == "union":
            truth = torch.cat([truth[:, :2].min(dim=0).values, truth[:, 2:].max(dim=0).values]).unsqueeze(0)
        together = torch.cat([boxes[p], truth]).unsqueeze(0)  # (1, O + n, 4)
        overlap = box_iou(together)[0, :objects, objects:]  # (O, n)
        correct = (overlap >= iou_threshold).any(dim=1)  # (O,)
        order = scores[p].argsort(descending=True)
        for k in ks:
            hits[k] += bool(correct[order[:k]].any())
    return {k: hits[k] / phrases for k in ks}


def box_targets(boxes: Tensor, truth: Tensor, *, iou_threshold: float = 0.5, merge: str = "any") -> Tensor:
    """(O,) bool: the candidate ``boxes`` (O, 4) that ground a phrase whose ground truth is
    ``truth`` (n, 4), all (x1, y1, x2, y2) in the same units: IoU >= ``iou_threshold`` with
    one of its boxes (``merge="any"``: BAN section 5.1, "IoU ... with one of the
    ground-truth boxes"; ban-vqa's ``utils.get_match_index``) or with their union box
    (``merge="union"``). All-zero (padding) boxes never match."""
    if merge not in ("union", "any"):
        raise ValueError(f"box_targets: merge must be 'union' or 'any', got {merge!r}")
    truth = truth.reshape(-1, 4).to(boxes.dtype)
    if len(truth) == 0:
        raise ValueError("box_targets: a phrase without a ground-truth box")
    if merge == "union":
        truth = torch.cat([truth[:, :2].min(dim=0).values, truth[:, 2:].max(dim=0).values]).unsqueeze(0)
    objects = len(boxes)
    overlap = box_iou(torch.cat([boxes, truth]).unsqueeze(0))[0, :objects, objects:]  # (O, n)
    return (overlap >= iou_threshold).any(dim=1)


def recall_counts(scores: Tensor, correct: Tensor, mask: Tensor, ks: Sequence[int] = (1, 5, 10)) -> tuple[Tensor, Tensor, Tensor]:
    """The counts behind Recall@K of a batch of phrases (ban-vqa's
    ``train_flickr.compute_recall_with_logits`` and its upper bound).

    Args:
        scores: (B, P, O) box scores of each phrase (-inf at padded boxes).
        correct: (B, P, O) bool, the boxes that ground the phrase (:func:`box_targets`).
        mask: (B, P) bool, the real phrases.
        ks: the K of Recall@K.

    Returns:
        hits (len(ks),): phrases with a correct box among their K best, ties broken by
        the lower box index; bound (): phrases with any correct candidate box (the upper
        bound the detector's boxes set); count (): phrases.
    """
    if scores.dim() != 3 or tuple(correct.shape) != tuple(scores.shape) or tuple(mask.shape) != tuple(scores.shape[:2]):
        raise ValueError(f"recall_counts: scores and correct must be (B, P, O) and mask (B, P), got "
                         f"{tuple(scores.shape)}, {tuple(correct.shape)}, {tuple(mask.shape)}")
    correct = correct.bool() & mask.unsqueeze(-1)
    order = torch.sort(scores.float(), dim=-1, descending=True, stable=True).indices
    ranked = correct.gather(-1, order)  # (B, P, O) correctness in rank order
    hits = torch.stack([ranked[..., : min(int(k), scores.shape[-1])].any(dim=-1).sum() for k in ks])
    return hits, correct.any(dim=-1).sum(), mask.sum()


class GroundingRecall(Metric):
    """Recall@K of phrase grounding over an epoch (``R@1``, ``R@5``, ``R@10``) and the
    ``upper_bound`` (phrases with any candidate box at IoU >= 0.5), fractions in [0, 1].

    ``update(scores, correct, mask)`` as :func:`recall_counts`; the states are sums
    (float64), added across processes under DDP.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, ks: Sequence[int] = (1, 5, 10)) -> None:
        super().__init__()
        self.ks = tuple(int(k) for k in ks)
        self.add_state("hits", torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bound", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, correct: Tensor, mask: Tensor) -> None:
        hits, bound, count = recall_counts(scores.detach(), correct, mask, self.ks)
        self.hits += hits.to(self.hits)
        self.bound += bound.to(self.bound)
        self.count += count.to(self.count)

    def compute(self) -> dict[str, Tensor]:
        count = self.count.clamp_min(1.0)
        values = {f"R@{k}": self.hits[i] / count for i, k in enumerate(self.ks)}
        values["upper_bound"] = self.bound / count
        return values
