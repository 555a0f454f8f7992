"""Chimera's HLM and L_D at the word-region level, as Eq. 11 and 12 define them.

Shapes: ``B`` pairs (row b of the texts pairs with row b of the images), ``N_t``
words and ``N_v`` regions (padded, with (B, N) bool masks, True at real ones),
``n`` hyperbolic dimension (points have n + 1 coordinates), ``d`` Euclidean size.

D, "all observed implicit feedback, i.e. positive image-word pairs" (Chimera sec.
3.6), is the set of (word i of text b, region j of image b): every word of a caption
with every region of its own image. A pair (k, j) not in D is a word k of another
text b' != b with region j of image b. So, for region j of image b (Eq. 11),

    L_HLM = sum_b sum_{i in b} sum_{j in b} sum_{b' != b} sum_{k in b'}
            [m + d_L^2(w~_{b,i}, v~_{b,j}) - d_L^2(w~_{b',k}, v~_{b,j})]_+

and (Eq. 12) the distortion runs over every word-region pair of the batch, positive
or negative,

    L_D = sum_{(b,i), (c,j)} |d_L(w~_{b,i}, v~_{c,j}) - d_E(w_{b,i}, v^_{c,j})| / d_E(w_{b,i}, v^_{c,j}).

``reduction="mean"`` divides by the number of terms; ``"none"`` returns the per-word
sums (B, N_t) (zero at padded words), so that a permutation of one caption's words
permutes its row exactly and leaves every other row unchanged.

Under ``torch.autocast`` both losses compute in float32 (autocast off, float32 returned).
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse._precision import float32_under_autocast
from polyfuse.functional.lorentz import lorentz_distance

__all__ = ["word_region_distortion_loss", "word_region_matching_loss"]


def _check(points: Tensor, mask: Tensor, name: str) -> None:
    if not isinstance(points, Tensor) or points.dim() != 3 or not points.is_floating_point():
        raise ValueError(f"{name} must be a (B, N, size) float tensor")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != points.shape[:2]:
        raise ValueError(f"{name}_mask must be a bool tensor of shape {tuple(points.shape[:2])}")
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"{name}: row {int(empty[0])} has no real position")


def _reduce(per_word: Tensor, count: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return per_word
    if reduction == "sum":
        return per_word.sum()
    if reduction == "mean":
        return per_word.sum() / count.clamp_min(1)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _distances(words: Tensor, regions: Tensor) -> Tensor:
    """(B, N_t, B, N_v) Lorentz distances d_L(w~_{b,i}, v~_{c,j})."""
    return lorentz_distance(words[:, :, None, None, :], regions[None, None, :, :, :])


@float32_under_autocast
def word_region_matching_loss(
    word_points: Tensor,
    region_points: Tensor,
    word_mask: Tensor,
    region_mask: Tensor,
    *,
    margin: float = 1.0,
    reduction: str = "mean",
) -> Tensor:
    """L_HLM over word-region pairs (Chimera Eq. 11, see the module docstring).

    Args:
        word_points: (B, N_t, n + 1) hyperboloid points w~ of the words.
        region_points: (B, N_v, n + 1) hyperboloid points v~ of the regions.
        word_mask: (B, N_t) bool. region_mask: (B, N_v) bool.
        margin: m > 0.
        reduction: "mean" over the hinge terms, "sum" (Eq. 11 as printed) or "none":
            (B, N_t), the terms summed per positive word (b, i).

    Returns:
        Scalar, or (B, N_t) for "none".
    """
    _check(word_points, word_mask, "word_points")
    _check(region_points, region_mask, "region_points")
    batch = word_points.shape[0]
    if region_points.shape[0] != batch or batch < 2:
        raise ValueError("word and region points need the same batch size, at least 2 (negatives)")
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    squared = _distances(word_points, region_points).pow(2)  # (B, N_t, B, N_v)
    own = torch.arange(batch)
    positive = squared[own, :, own, :]  # (B, N_t, N_v): d^2(w_{b,i}, v_{b,j})
    negative = squared.permute(2, 3, 0, 1)  # (B_img, N_v, B_txt, N_t): d^2(w_{b',k}, v_{b,j})
    # terms[b, i, j, b', k] = [m + positive[b, i, j] - negative[b, j, b', k]]_+
    terms = torch.relu(margin + positive[:, :, :, None, None] - negative[:, None, :, :, :])
    valid = (
        word_mask[:, :, None, None, None]
        & region_mask[:, None, :, None, None]
        & word_mask[None, None, None, :, :]
        & ~torch.eye(batch, dtype=torch.bool)[:, None, None, :, None]
    )
    terms = torch.where(valid, terms, 0.0)
    return _reduce(terms.sum(dim=(2, 3, 4)), valid.sum(), reduction)


@float32_under_autocast
def word_region_distortion_loss(
    word_points: Tensor,
    region_points: Tensor,
    word_embeddings: Tensor,
    region_embeddings: Tensor,
    word_mask: Tensor,
    region_mask: Tensor,
    *,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """L_D over every word-region pair of the batch (Chimera Eq. 12).

    Args:
        word_points, region_points: (B, N_t, n + 1), (B, N_v, n + 1) hyperboloid points.
        word_embeddings, region_embeddings: (B, N_t, d), (B, N_v, d) the Euclidean
            vectors w and v^ (in Chimera the tangents whose exponential maps are the points).
        word_mask, region_mask: (B, N_t), (B, N_v) bool.
        eps: floor of d_E in the denominator.
        reduction: "mean" over the pairs, "sum" (Eq. 12 as printed) or "none" (B, N_t).

    Returns:
        Scalar, or (B, N_t) for "none".
    """
    _check(word_points, word_mask, "word_points")
    _check(region_points, region_mask, "region_points")
    _check(word_embeddings, word_mask, "word_embeddings")
    _check(region_embeddings, region_mask, "region_embeddings")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    lorentz = _distances(word_points, region_points)  # (B, N_t, B, N_v)
    difference = word_embeddings[:, :, None, None, :] - region_embeddings[None, None, :, :, :]
    squared = difference.pow(2).sum(-1)
    euclidean = torch.where(squared > 0, torch.sqrt(squared.clamp_min(torch.finfo(squared.dtype).tiny)), 0.0)
    terms = (lorentz - euclidean).abs() / euclidean.clamp_min(eps)  # Eq. 12
    valid = word_mask[:, :, None, None] & region_mask[None, None, :, :]
    terms = torch.where(valid, terms, 0.0)
    return _reduce(terms.sum(dim=(2, 3)), valid.sum(), reduction)
