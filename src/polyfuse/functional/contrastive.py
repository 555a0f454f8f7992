"""Contrastive objectives for cross-modal retrieval over a batch.

Shapes: ``B_t`` texts and ``B_v`` videos in the batch; ``scores`` (B_t, B_v) holds
s(text_i, video_j) (cosine similarities for MAN section 3.3); ``positives``
(B_t, B_v) bool marks the matching pairs. Several captions of one video may share a
batch: all of them are positives of that video, never negatives of it.

Under ``torch.autocast`` both losses compute in float32 (autocast off, float32 returned):
the logsumexp over the batch must not run in bfloat16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse._precision import float32_under_autocast

__all__ = ["info_nce_loss", "max_margin_ranking_loss"]


def _check(scores: object, positives: object) -> tuple[Tensor, Tensor]:
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() != 2:
        raise ValueError("scores must be a (B_t, B_v) float tensor")
    if not isinstance(positives, Tensor) or positives.dtype != torch.bool:
        raise ValueError("positives must be a bool tensor")
    if positives.shape != scores.shape:
        raise ValueError(f"positives has shape {tuple(positives.shape)}, scores {tuple(scores.shape)}")
    if not bool(positives.any(dim=1).all()) or not bool(positives.any(dim=0).all()):
        raise ValueError("every text and every video of the batch needs at least one positive")
    return scores, positives


@float32_under_autocast
def max_margin_ranking_loss(
    scores: Tensor, positives: Tensor, *, margin: float = 0.2, hardest: bool = True
) -> Tensor:
    """Bidirectional max-margin ranking loss (MAN sec. 3.3, as in collaborative experts;
    hardest negatives as in VSE++, Faghri et al. 2018).

    For every positive pair (i, j):

        text-to-video: [m - s(i, j) + s(i, k)]_+ over the negative videos k of text i
        video-to-text: [m - s(i, j) + s(l, j)]_+ over the negative texts l of video j

    ``hardest=True`` keeps only the largest term of each sum (VSE++); ``False`` sums
    them all. The result is averaged over the positive pairs. A row (column) with no
    negative contributes 0.

    Args:
        scores: (B_t, B_v). positives: (B_t, B_v) bool. margin: m > 0.

    Returns:
        Scalar loss.
    """
    scores, positives = _check(scores, positives)
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    pos_i, pos_j = positives.nonzero(as_tuple=True)
    positive_scores = scores[pos_i, pos_j].unsqueeze(1)  # (P, 1)
    text_rows = scores[pos_i]  # (P, B_v): s(i, k)
    video_cols = scores[:, pos_j].T  # (P, B_t): s(l, j)
    t2v = (margin - positive_scores + text_rows).clamp_min(0).masked_fill(positives[pos_i], 0.0)
    v2t = (margin - positive_scores + video_cols).clamp_min(0).masked_fill(positives[:, pos_j].T, 0.0)
    if hardest:
        return (t2v.amax(dim=1) + v2t.amax(dim=1)).mean()
    return (t2v.sum(dim=1) + v2t.sum(dim=1)).mean()


@float32_under_autocast
def info_nce_loss(scores: Tensor, positives: Tensor, *, temperature: float = 0.05) -> Tensor:
    """Symmetric InfoNCE (CLIP, Radford et al. 2021) with several positives per row.

    For every positive pair (i, j), the other positives of text i (of video j) are
    left out of its denominator:

        text-to-video: -log exp(s_ij / tau) / (exp(s_ij / tau) + sum_{k neg of i} exp(s_ik / tau))

    and likewise video-to-text over the texts; the two directions are averaged over the
    positive pairs and then with each other.

    Args:
        scores: (B_t, B_v). positives: (B_t, B_v) bool. temperature: tau > 0.

    Returns:
        Scalar loss.
    """
    scores, positives = _check(scores, positives)
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    logits = scores / temperature
    pos_i, pos_j = positives.nonzero(as_tuple=True)
    positive_logits = logits[pos_i, pos_j]  # (P,)
    t2v_negatives = logits[pos_i].masked_fill(positives[pos_i], float("-inf"))  # (P, B_v)
    v2t_negatives = logits[:, pos_j].T.masked_fill(positives[:, pos_j].T, float("-inf"))
    t2v = torch.logaddexp(positive_logits, torch.logsumexp(t2v_negatives, dim=1)) - positive_logits
    v2t = torch.logaddexp(positive_logits, torch.logsumexp(v2t_negatives, dim=1)) - positive_logits
    return 0.5 * (t2v.mean() + v2t.mean())
