"""The fast path of multi-linear attention's had mode (MAN Eq. 9 to 12).

:func:`polyfuse.functional.multilinear._had_attention` lays its inputs out with
:func:`had_layout` and :func:`stack_features`, then runs :func:`had_chunked`
(without gradients: chunk by chunk, in place, in buffers that stay in cache) or
:func:`had_whole` (with gradients: the same steps on whole tensors, out of place,
for autograd). The straightforward form of the equations,
``_had_attention_reference`` beside it, is the oracle the tests hold this to.

Shapes: ``G`` "heads" (the flattened leading dims of the random features, one
random matrix each), ``N`` "rows" (the flattened leading dims they are shared
over, e.g. the batch), ``T = sum_j T_j`` (the modalities stacked along time), ``K'``
feature size, ``K`` value size, ``H`` random features, ``m`` modalities.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "CHUNK_BYTES",
    "HadLayout",
    "augmented_weights",
    "elementwise_product",
    "from_layout",
    "had_chunked",
    "had_layout",
    "had_whole",
    "in_layout",
    "max_over_steps",
    "padded_in_layout",
    "stack_features",
    "to_layout",
]

# Bytes of the exponent block that one chunk of the inference path works on: on CPU
# small enough for each core's share to stay in its L2 cache across the passes (max,
# exp, products); elsewhere large, since every chunk costs kernel launches.
CHUNK_BYTES = {"cpu": 4 << 20}
CHUNK_BYTES_DEFAULT = 256 << 20


class HadLayout(NamedTuple):
    """How :func:`_had_attention` lays its inputs out.

    The leading dims ``lead`` of the inputs (batch, heads, ...) are reordered so that
    those of the random features come first, flattened to ``heads`` (one random
    matrix each), and those the random features are shared over come next, flattened
    to ``rows``: every random matrix then meets all of its rows in one matrix product.
    The modalities are stacked along time, modality j at steps
    ``offsets[j]:offsets[j + 1]`` of ``offsets[-1] = sum_j T_j``.
    """

    lead: torch.Size
    order: tuple[int, ...]
    heads: int
    rows: int
    lengths: tuple[int, ...]
    offsets: tuple[int, ...]


def had_layout(lead: torch.Size, features: Sequence[Tensor], random_features: Tensor) -> HadLayout:
    """The layout for inputs whose leading dims broadcast to ``lead``."""
    rank = len(lead)
    # The random features' leading dims, right-aligned with ``lead`` (MAN: (G,) against (B, G)).
    own = (1,) * (rank - random_features.dim() + 2) + tuple(random_features.shape[:-2])
    per_matrix = [i for i in range(rank) if own[i] > 1]
    shared = [i for i in range(rank) if own[i] == 1]
    lengths = tuple(a.shape[-2] for a in features)
    return HadLayout(
        lead,
        (*per_matrix, *shared),
        math.prod(lead[i] for i in per_matrix),
        math.prod(lead[i] for i in shared),
        lengths,
        (0, *itertools.accumulate(lengths)),
    )


def to_layout(tensor: Tensor, layout: HadLayout, trailing: int) -> Tensor:
    """(..., *tail) with ``trailing`` tail dims -> (*lead in layout order, *tail), a view."""
    rank = len(layout.lead)
    tail = tensor.shape[tensor.dim() - trailing :]
    expanded = tensor.expand(*layout.lead, *tail)
    return expanded.permute(*layout.order, *range(rank, rank + trailing))


def from_layout(tensor: Tensor, layout: HadLayout) -> Tensor:
    """(heads, rows, d) -> (*lead, d), undoing the layout's reordering."""
    ordered = [layout.lead[i] for i in layout.order]
    rank = len(layout.lead)
    inverse = sorted(range(rank), key=layout.order.__getitem__)
    shaped = tensor.reshape(*ordered, tensor.shape[-1])
    return shaped.permute(*inverse, rank).contiguous()


def stack_features(
    features: Sequence[Tensor], temperature: float, layout: HadLayout, differentiable: bool
) -> Tensor:
    """Stack the modalities' features along time for one batched matrix product.

    Returns:
        (heads, rows, T, K' + 1): the features a_j[t] followed by
        -temperature |a_j[t]|^2 / 2 (see :func:`augmented_weights`).
    """
    ordered = [layout.lead[i] for i in layout.order]
    feature_dim = features[0].shape[-1]
    stacked = features[0].new_empty(*ordered, layout.offsets[-1], feature_dim + 1)
    for (start, stop), a in zip(spans(layout), features, strict=True):
        stacked[..., start:stop, :feature_dim] = to_layout(a, layout, 2)
        if differentiable:  # slice assignments only: autograd must not see a read overwritten
            squared_norms = (a * a).sum(-1, keepdim=True)
            stacked[..., start:stop, feature_dim:] = to_layout(squared_norms, layout, 2)
    if differentiable:
        stacked[..., feature_dim] *= -0.5 * temperature
    else:  # one pass over the stacked features, in place
        squared_norms = torch.linalg.vector_norm(stacked[..., :feature_dim], dim=-1).square_()
        torch.mul(squared_norms, -0.5 * temperature, out=stacked[..., feature_dim])
    return stacked.view(layout.heads, layout.rows, layout.offsets[-1], feature_dim + 1)


def augmented_weights(random_features: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    """(heads, K' + 1, H): sqrt(temperature) W^T followed by a row of ones, so that
    [a, -temperature |a|^2 / 2] times it is the exponent of Eq. 11 at sqrt(temperature) a."""
    num_random_features, feature_dim = random_features.shape[-2:]
    matrices = random_features.to(dtype).reshape(-1, num_random_features, feature_dim)
    ones = matrices.new_ones(matrices.shape[0], 1, num_random_features)
    return torch.cat([matrices.transpose(-1, -2) * math.sqrt(temperature), ones], dim=-2)


def padded_in_layout(masks: Sequence[Tensor | None], layout: HadLayout, device: torch.device) -> Tensor | None:
    """(heads, rows, T) bool, True at padded steps; None when no modality has padding."""
    if all(mask is None for mask in masks):
        return None
    ordered = [layout.lead[i] for i in layout.order]
    padded = torch.zeros(*ordered, layout.offsets[-1], dtype=torch.bool, device=device)
    for (start, stop), mask in zip(spans(layout), masks, strict=True):
        if mask is not None:
            padded[..., start:stop] = to_layout(~mask, layout, 1)
    return padded.view(layout.heads, layout.rows, -1)


def stabilisers_for(exponent: Tensor, layout: HadLayout) -> Tensor:
    """Per modality j and feature h the largest exponent m_j[h] over real steps (note 5),
    with the rescaling weight exp(sum_j m_j[h] - max_h sum_j m_j[h]) folded into m_0.

    Args:
        exponent: (..., T, H), the modalities stacked along time, -inf at padded steps.

    Returns:
        (..., m, H), without gradient: the result does not depend on the stabilisers.
    """
    exponent = exponent.detach()
    if len(set(layout.lengths)) == 1:
        by_modality = exponent.unflatten(-2, (len(layout.lengths), layout.lengths[0]))
        stabilisers = max_over_steps(by_modality)
    else:
        stabilisers = torch.stack(
            [exponent[..., start:stop, :].amax(dim=-2) for start, stop in spans(layout)], dim=-2
        )
    total = stabilisers.sum(dim=-2)  # (..., H)
    stabilisers[..., 0, :] += total.amax(dim=-1, keepdim=True) - total
    return stabilisers


def max_over_steps(exponent: Tensor) -> Tensor:
    """``exponent.amax(dim=-2)`` for (..., T, H), fast for every H on CPU.

    The CPU ``amax`` kernel reduces over a strided axis quickly only when the rows
    it keeps (H values) fill whole pairs of vector registers (128 bytes); otherwise
    it runs about ten times slower. There, a max pooling over the steps, with H as
    the channels of a channels-last image, gives the same values fast.
    """
    steps, features = exponent.shape[-2:]
    if exponent.device.type != "cpu" or (features * exponent.element_size()) % 128 == 0:
        return exponent.amax(dim=-2)
    if not exponent.is_contiguous():
        return exponent.amax(dim=-2)
    images = exponent.reshape(-1, steps, 1, features).permute(0, 3, 1, 2)  # channels last
    pooled = torch.nn.functional.max_pool2d(images, (steps, 1))  # (N, H, 1, 1)
    return pooled.reshape(*exponent.shape[:-2], features)


def spans(layout: HadLayout) -> list[tuple[int, int]]:
    return list(itertools.pairwise(layout.offsets))


def had_whole(
    stacked_features: Tensor,
    weights: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps on whole tensors, out of place: the path autograd differentiates."""
    heads, rows, total, _ = stacked_features.shape
    exponent = torch.matmul(stacked_features.view(heads, rows * total, -1), weights)
    exponent = exponent.view(heads, rows, total, -1)  # Eq. 11 exponents, (G, N, T, H)
    if padded is not None:
        exponent = exponent.masked_fill(padded.unsqueeze(-1), float("-inf"))  # B_j = 0 there
    stabilisers = stabilisers_for(exponent, layout)  # (G, N, m, H)
    # split, not slices: the backward of a split is one concatenation, that of each
    # slice a zero tensor of the whole exponent's size.
    random = [
        torch.exp(piece - stabiliser.unsqueeze(-2))
        for piece, stabiliser in zip(
            exponent.split(list(layout.lengths), dim=-2), stabilisers.unbind(-2), strict=True
        )
    ]  # B_j^T, (G, N, T_j, H)
    last = len(random) - 1
    # sum_h prod_j (B_j^T v_j)[h, k], Eq. 10, with the last factor contracted over t last.
    product = elementwise_product(
        [b.transpose(-1, -2) @ v for b, v in zip(random[:last], values, strict=False)]
    )
    numerator = ((random[last] @ product) * values[last]).sum(dim=-2)  # (G, N, K)
    sums = [b.sum(dim=-2) for b in random]  # B_j 1, (G, N, H)
    denominator = elementwise_product(sums).sum(dim=-1, keepdim=True)  # sum A, Eq. 12
    output = numerator / denominator
    marginals = []
    if return_attention:
        for j, features_j in enumerate(random):
            others = elementwise_product([s for i, s in enumerate(sums) if i != j])
            marginals.append((features_j @ others.unsqueeze(-1)).squeeze(-1) / denominator)
    return output, marginals


def chunk_sizes(layout: HadLayout, num_random_features: int, tensor: Tensor) -> tuple[int, int]:
    """How many heads and rows one chunk of the inference path takes: as many as fit in
    the budget, or everything when that is at most twice the budget (one chunk costs
    less than two smaller ones there)."""
    budget = CHUNK_BYTES.get(tensor.device.type, CHUNK_BYTES_DEFAULT)
    block = layout.offsets[-1] * num_random_features * tensor.element_size()  # one head, one row
    if layout.heads * layout.rows * block <= 2 * budget:
        return layout.heads, layout.rows
    if layout.heads * block <= budget:
        return layout.heads, max(1, min(layout.rows, budget // (layout.heads * block)))
    return max(1, min(layout.heads, budget // block)), 1


@torch.no_grad()
def had_chunked(
    stacked_features: Tensor,
    weights: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps chunk by chunk, in place, in preallocated buffers (no gradients).

    ``stacked_features`` (G, N, T, K' + 1) from :func:`stack_features`, ``values`` per
    modality (G, N, T_j, K).
    """
    heads, rows, total, _ = stacked_features.shape
    num_random_features = weights.shape[-1]
    value_dim = values[0].shape[-1]
    head_chunk, row_chunk = chunk_sizes(layout, num_random_features, weights)
    capacity = head_chunk * row_chunk
    new = weights.new_empty
    buffers = (
        new(capacity * total * num_random_features),
        new(capacity * num_random_features * value_dim),
        new(capacity * num_random_features * value_dim),
    )
    output = new(heads, rows, value_dim)
    marginals = [new(heads, rows, t) for t in layout.lengths] if return_attention else []
    transposed = [v.transpose(-1, -2) for v in values]  # v_j^T, (G, N, K, T_j)
    for head_start in range(0, heads, head_chunk):
        head_span = slice(head_start, min(heads, head_start + head_chunk))
        for row_start in range(0, rows, row_chunk):
            span = (head_span, slice(row_start, min(rows, row_start + row_chunk)))
            if row_chunk == 1 and head_chunk == heads:  # one op per modality: a view
                chunk_values = [v.select(1, row_start) for v in transposed]
            else:
                chunk_values = [v[span].flatten(0, 1) for v in transposed]
            had_chunk(
                stacked_features[span],
                weights[head_span],
                chunk_values,
                None if padded is None else padded[span],
                layout,
                buffers,
                output[span],
                [marginal[span] for marginal in marginals],
            )
    return output, marginals


def had_chunk(
    stacked_features: Tensor,
    weights: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    buffers: tuple[Tensor, Tensor, Tensor],
    output: Tensor,
    marginals: Sequence[Tensor],
) -> None:
    """One chunk of :func:`had_chunked`: (g, n, T, K' + 1) stacked features, values v_j^T
    as (g n, K, T_j); writes ``output`` (g, n, K) and, if given, ``marginals`` (g, n, T_j)."""
    heads, rows, total, feature_dim = stacked_features.shape
    num_random_features = weights.shape[-1]
    value_dim = values[0].shape[-2]
    count = heads * rows
    lengths, offsets = layout.lengths, layout.offsets
    num_modalities = len(lengths)
    exponent_buffer, product_buffer, term_buffer = buffers
    exponent = exponent_buffer[: count * total * num_random_features].view(heads, rows * total, -1)
    torch.bmm(stacked_features.view(heads, rows * total, feature_dim), weights, out=exponent)
    exponent = exponent.view(count, total, num_random_features)  # Eq. 11 exponents
    if padded is not None:
        exponent.masked_fill_(padded.reshape(count, total, 1), float("-inf"))  # B_j = 0 there
    # Stabilisers (note 5), the rescaling weight folded into modality 0's: see stabilisers_for.
    if len(set(lengths)) == 1:
        by_modality = exponent.view(count, num_modalities, lengths[0], num_random_features)
        stabilisers = max_over_steps(by_modality)  # (g n, m, H)
    else:
        stabilisers = torch.stack(
            [exponent[:, start:stop].amax(dim=1) for start, stop in itertools.pairwise(offsets)], 1
        )
    stabiliser_sum = stabilisers.sum(dim=1)  # (g n, H)
    stabilisers[:, 0] += stabiliser_sum.amax(dim=-1, keepdim=True) - stabiliser_sum
    if len(set(lengths)) == 1:
        by_modality.sub_(stabilisers.unsqueeze(2)).exp_()  # B_j^T for every modality
        sums = by_modality.sum(dim=2)  # B_j 1, (g n, m, H)
        random = by_modality.unbind(1)  # (g n, T_j, H) views
    else:
        for j, (start, stop) in enumerate(itertools.pairwise(offsets)):
            exponent[:, start:stop].sub_(stabilisers[:, j].unsqueeze(1))
        exponent.exp_()
        random = [exponent[:, start:stop] for start, stop in itertools.pairwise(offsets)]
        sums = torch.stack([b.sum(dim=1) for b in random], 1)
    # With v_j^T on the left the contractions produce (K, H), whose long rows suit the
    # matrix kernels better than (H, K).
    size = count * num_random_features * value_dim
    product = product_buffer[:size].view(count, value_dim, num_random_features)
    term = term_buffer[:size].view_as(product)
    last = num_modalities - 1
    torch.bmm(values[0], random[0], out=product)  # (B_0^T v_0)^T, Eq. 10
    for j in range(1, last):
        torch.bmm(values[j], random[j], out=term)
        product.mul_(term)
    # sum_h product[k, h] (v^T B)[k, h] = sum_t v[t, k] (product B^T)[k, t], last modality
    mixed = torch.bmm(product, random[last].transpose(1, 2))  # (g n, K, T_last)
    numerator = mixed.mul_(values[last]).sum(dim=2)  # (g n, K)
    denominator = sums.prod(dim=1).sum(dim=-1, keepdim=True)  # sum A, Eq. 12, (g n, 1)
    torch.div(numerator.view(heads, rows, -1), denominator.view(heads, rows, 1), out=output)
    for j, marginal in enumerate(marginals):
        others = elementwise_product([sums[:, i] for i in range(num_modalities) if i != j])  # (g n, H)
        weighted = torch.bmm(random[j], others.unsqueeze(-1)).squeeze(-1) / denominator
        marginal.copy_(weighted.view_as(marginal))


def in_layout(tensors: Sequence[Tensor], layout: HadLayout) -> list[Tensor]:
    """(..., T_j, d) per modality -> (G, N, T_j, d), views where the layout allows."""
    return [
        to_layout(t, layout, 2).reshape(layout.heads, layout.rows, *t.shape[-2:]) for t in tensors
    ]


def elementwise_product(tensors: Sequence[Tensor]) -> Tensor:
    """The element-wise product of the tensors, left to right."""
    result = tensors[0]
    for tensor in tensors[1:]:
        result = result * tensor
    return result
