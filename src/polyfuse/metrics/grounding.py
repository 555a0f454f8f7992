"""Phrase grounding: Recall@K of boxes ranked by attention (BAN section 5, Flickr30k Entities).

A phrase counts as grounded at K when one of the K highest-scoring boxes has
IoU >= 0.5 with its ground truth. A phrase with several ground-truth boxes is
represented by their union box (Plummer et al., ICCV 2015, the protocol BAN follows),
or, with ``merge="any"``, matched against each of them.

Legend for shapes: ``P`` phrases, ``O`` candidate boxes, ``G`` glimpses, ``L`` words.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from polyfuse.functional.counting import box_iou

__all__ = ["grounding_recall", "phrase_scores"]


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
    merge: str = "union",
) -> dict[int, float]:
    """Recall@K over phrases, as fractions in [0, 1].

    Args:
        scores: (P, O) score of every candidate box for every phrase.
        boxes: (O, 4) candidate boxes shared by the phrases, or (P, O, 4), as (x1, y1, x2, y2).
        truths: P tensors (n_p, 4) of ground-truth boxes, n_p >= 1.
        ks: the K of Recall@K (K larger than O ranks all boxes).
        iou_threshold: the IoU a box needs (0.5).
        merge: ``"union"`` (one box around a phrase's ground truth) or ``"any"``.
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
