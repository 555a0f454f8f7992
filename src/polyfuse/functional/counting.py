"""The counting component of Zhang, Hare and Prügel-Bennett, as pure functions.

Y. Zhang, J. Hare, A. Prügel-Bennett. "Learning to Count Objects in Natural Images
for Visual Question Answering." ICLR 2018 (section 3). BAN (Kim et al., NeurIPS
2018, section 5) adds its count features to the joint representation per glimpse.

Legend for shapes: ``B`` batch, ``M`` number of boxes given, ``K`` number of boxes
kept (``objects``, the top-K by attention), ``n`` pieces of a piecewise linear
function (its weight has ``n + 1`` entries).

The paper's eight monotone piecewise linear functions f_1..f_8 map [0, 1] onto
[0, 1]; here they are the rows of ``weights`` (8, n + 1), row ``k - 1`` for f_k:

    A = a a^T                                   attention graph (section 3.1)
    D_ij = 1 - IoU(b_i, b_j)                    distance between boxes (3.1)
    Ã = f_1(A) o f_2(D)                         intra-object edges removed (3.2)
    X = f_4(A) o f_5(D)                         what inter-object dedup compares (3.2)
    s_ij = f_3(1 - |a_i - a_j|) prod_k f_3(1 - |X_ik - X_jk|)   similarity (3.2)
    s_i = sum_j s_ij                            how many copies of object i
    C = sum_ij Ã_ij / (s_i s_j) + sum_i f_1(a_i a_i) / s_i      count matrix sum (3.3)
    c = sqrt(C)                                 the count (3.3)
    o = one-hot of c, linearly interpolated between floor(c) and ceil(c)   (3.3)
    p_a = mean_i |f_6(a_i) - 1/2|, p_D = mean_ij |f_7(D_ij) - 1/2|      (3.4)
    output = f_8(p_a + p_D) o                   count features, (B, K + 1) (3.4)

The attention a_i is the sigmoid of the given logits (``already_sigmoided=False``),
as in BAN where the logit of box i is the maximum over words of its attention logits.
The computation is laid out as in the authors' code (github.com/Cyanogenoid/vqa-counting),
which ban-vqa ships unchanged, so that a trained counter gives the same numbers.

Under ``torch.autocast`` the count computes in float32 (autocast off, float32 returned):
its products over boxes, divisions by the copy counts s_i and the square root would lose
the fractional count in bfloat16 (8 bits) or float16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse._precision import float32_under_autocast

__all__ = [
    "box_iou",
    "count_features",
    "count_score",
    "count_to_one_hot",
    "grid_boxes",
    "piecewise_linear",
]

NUM_FUNCTIONS = 8  # f_1 .. f_8 of section 3


def piecewise_linear(x: Tensor, weight: Tensor) -> Tensor:
    """A monotone piecewise linear function of [0, 1] onto [0, 1] (section 3.5).

    With ``w = |weight| / sum |weight|`` (``weight[0]`` is the value at 0, kept 0 in
    practice) the function passes through ``(k / n, w_0 + ... + w_k)``:
    ``f(x) = cumsum(w)[floor(n x)] + frac(n x) * w[floor(n x) + 1]``.

    Args:
        x: any shape, values in [0, 1].
        weight: (n + 1,).

    Returns:
        f(x), the shape of ``x``.
    """
    if weight.dim() != 1 or weight.numel() < 2:
        raise ValueError(f"piecewise_linear: weight must have shape (n + 1,), n >= 1, got {tuple(weight.shape)}")
    pieces = weight.numel() - 1
    normalised = weight.abs() / weight.abs().sum()
    cumulative = normalised.cumsum(dim=0)
    scaled = pieces * x
    index = scaled.detach().long()
    fraction = scaled.frac()
    return cumulative[index.clamp(max=pieces)] + fraction * normalised[(index + 1).clamp(max=pieces)]


def box_iou(boxes: Tensor) -> Tensor:
    """Intersection over union of every pair of boxes of a sample, (B, M, 4) -> (B, M, M).

    Boxes are ``(x1, y1, x2, y2)``, top-left then bottom-right corner; a box with
    x2 < x1 or y2 < y1 has area 0. A pair of empty boxes has IoU 0 (1e-12 is added
    to the union as in the authors' code).
    """
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"box_iou: boxes must have shape (B, M, 4), got {tuple(boxes.shape)}")
    top_left = torch.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2])  # (B, M, M, 2)
    bottom_right = torch.minimum(boxes[:, :, None, 2:], boxes[:, None, :, 2:])
    sides = (bottom_right - top_left).clamp(min=0)
    intersection = sides[..., 0] * sides[..., 1]  # (B, M, M)
    extent = (boxes[..., 2:] - boxes[..., :2]).clamp(min=0)
    area = extent[..., 0] * extent[..., 1]  # (B, M)
    union = area[:, :, None] + area[:, None, :] - intersection
    return intersection / (union + 1e-12)


def _outer_difference(values: Tensor) -> Tensor:
    """|v_i - v_j| over the last axis: (..., K) -> (..., K, K)."""
    return (values.unsqueeze(-1) - values.unsqueeze(-2)).abs()


def _check_inputs(boxes: Tensor, attention: Tensor, weights: Tensor, objects: int) -> None:
    owner = "count_features"
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"{owner}: boxes must have shape (B, M, 4), got {tuple(boxes.shape)}")
    if attention.shape != boxes.shape[:2]:
        raise ValueError(
            f"{owner}: attention has shape {tuple(attention.shape)}, but boxes give (B, M) = "
            f"{tuple(boxes.shape[:2])}"
        )
    if weights.dim() != 2 or weights.shape[0] < NUM_FUNCTIONS or weights.shape[1] < 2:
        raise ValueError(
            f"{owner}: weights must have shape ({NUM_FUNCTIONS}, n + 1), got {tuple(weights.shape)}"
        )
    if not 1 <= objects <= boxes.shape[1]:
        raise ValueError(
            f"{owner}: objects={objects} must lie in [1, M] with M = {boxes.shape[1]} boxes given"
        )


def _keep_most_attended(boxes: Tensor, attention: Tensor, objects: int) -> tuple[Tensor, Tensor]:
    """The ``objects`` boxes with the highest attention: (B, K, 4) and (B, K).

    The count is symmetric in the boxes, so their order does not matter.
    """
    attention, index = attention.topk(objects, dim=1)
    boxes = boxes.gather(1, index.unsqueeze(-1).expand(-1, -1, 4))
    return boxes, attention


@float32_under_autocast
def count_score(
    boxes: Tensor,
    attention: Tensor,
    weights: Tensor,
    *,
    objects: int = 10,
    already_sigmoided: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The count c = sqrt(C) of the most attended boxes (sections 3.1-3.3).

    Args:
        boxes: (B, M, 4) as ``(x1, y1, x2, y2)``.
        attention: (B, M) logits (or values in [0, 1] if ``already_sigmoided``).
        weights: (8, n + 1), row k - 1 the weight of f_k (extra rows are ignored).
        objects: K, how many boxes are kept (the reference's 10).
        already_sigmoided: ``attention`` is already in [0, 1].

    Returns:
        ``(count, attention, distance)``: the count (B, 1), the attention a of the
        kept boxes (B, K) and their distances D (B, K, K).
    """
    _check_inputs(boxes, attention, weights, objects)
    boxes, attention = _keep_most_attended(boxes, attention, objects)
    if not already_sigmoided:
        attention = torch.sigmoid(attention)
    f = [lambda x, k=k: piecewise_linear(x, weights[k]) for k in range(NUM_FUNCTIONS)]
    relevancy = attention.unsqueeze(-1) * attention.unsqueeze(-2)  # A = a a^T, (B, K, K)
    distance = 1 - box_iou(boxes)  # D, (B, K, K)
    score = f[0](relevancy) * f[1](distance)  # Ã = f_1(A) o f_2(D)
    compared = f[3](relevancy) * f[4](distance)  # X = f_4(A) o f_5(D)
    # s_jk = f_3(1 - |a_j - a_k|) prod_i f_3(1 - |X_ij - X_ik|), (B, K, K)
    similarity = f[2](1 - _outer_difference(compared)).prod(dim=1) * f[2](
        1 - _outer_difference(attention)
    )
    copies = similarity.sum(dim=2)  # s_i, (B, K)
    score = score / (copies.unsqueeze(-1) * copies.unsqueeze(-2))  # Ã_ij / (s_i s_j)
    diagonal = f[0](attention * attention) / copies  # f_1(A_ii) / s_i
    total = score.sum(dim=(1, 2)).unsqueeze(1) + diagonal.sum(dim=1, keepdim=True)  # C
    return (total + 1e-20).sqrt(), attention, distance


def count_to_one_hot(count: Tensor, objects: int) -> Tensor:
    """One-hot of a non-negative count, interpolated (section 3.3): (B, 1) -> (B, K + 1).

    E.g. with K = 3: 0 -> [1, 0, 0, 0] and 2.75 -> [0, 0, 0.25, 0.75]; counts are
    clamped to [0, K].
    """
    count = count.clamp(min=0, max=objects)
    lower = count.detach().long()
    fraction = count.frac()
    rows = torch.zeros(count.shape[0], objects + 1, dtype=count.dtype, device=count.device)
    at_lower = rows.scatter(1, lower.clamp(max=objects), 1.0)
    at_upper = rows.scatter(1, (lower + 1).clamp(max=objects), 1.0)
    return (1 - fraction) * at_lower + fraction * at_upper


@float32_under_autocast
def count_features(
    boxes: Tensor,
    attention: Tensor,
    weights: Tensor,
    *,
    objects: int = 10,
    already_sigmoided: bool = False,
) -> Tensor:
    """Count features f_8(p_a + p_D) o onehot(c) (ICLR 2018, section 3.4).

    Arguments as :func:`count_score`.

    Returns:
        (B, K + 1) count features: mass on the entries floor(c) and ceil(c), scaled
        by the confidence.
    """
    count, attention, distance = count_score(
        boxes, attention, weights, objects=objects, already_sigmoided=already_sigmoided
    )
    one_hot = count_to_one_hot(count, objects)
    attention_confidence = (piecewise_linear(attention, weights[5]) - 0.5).abs()  # |f_6(a_i) - 1/2|
    distance_confidence = (piecewise_linear(distance, weights[6]) - 0.5).abs()  # |f_7(D_ij) - 1/2|
    confidence = piecewise_linear(  # f_8(p_a + p_D), (B, 1)
        attention_confidence.mean(dim=1, keepdim=True)
        + distance_confidence.mean(dim=2).mean(dim=1, keepdim=True),
        weights[7],
    )
    return one_hot * confidence


def grid_boxes(rows: int, columns: int) -> Tensor:
    """Boxes of the cells of a rows x columns grid over the unit square, (rows * columns, 4)
    as (x1, y1, x2, y2), row-major (the order of a flattened CNN feature map)."""
    y, x = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
    x, y = x.flatten().float(), y.flatten().float()
    return torch.stack([x / columns, y / rows, (x + 1) / columns, (y + 1) / rows], dim=-1)
