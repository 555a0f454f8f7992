"""The fast path of multi-linear attention's had mode (MAN Eq. 9 to 12).

:func:`polyfuse.functional.multilinear._had_attention` lays its inputs out with
:func:`had_layout`, builds the random features' exponent rows, stacked along time, with
:func:`augmented_features` (the estimator: MAN's ARF or the default centred generalised
features) and the columns with :func:`augmented_weights`, then runs :func:`had_chunked`
(without gradients: chunk by chunk, in place, in buffers that stay in cache),
:class:`HadFunction` (with gradients: the same forward, a backward that recomputes
chunk by chunk) or :func:`had_whole` (marginals with gradients: whole tensors, for
autograd). The tests hold all of them to brute-force loops over tuples.

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

from polyfuse.functional import random_features as random_features_module

__all__ = [
    "CHUNK_BYTES",
    "ESTIMATORS",
    "HadFunction",
    "HadLayout",
    "augmented_features",
    "augmented_weights",
    "elementwise_product",
    "from_layout",
    "had_chunked",
    "had_layout",
    "had_whole",
    "in_layout",
    "max_over_steps",
    "padded_in_layout",
    "to_layout",
]

# Bytes of the exponent block that one chunk of the inference path works on: on CPU
# small enough for each core's share to stay in its L2 cache across the passes (max,
# exp, products); elsewhere large, since every chunk costs kernel launches.
CHUNK_BYTES = {"cpu": 4 << 20}
ESTIMATORS = ("gerf", "arf")
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


def had_layout(lead: torch.Size, features: Sequence[Tensor], random_matrix: Tensor) -> HadLayout:
    """The layout for inputs whose leading dims broadcast to ``lead``."""
    rank = len(lead)
    # The random features' leading dims, right-aligned with ``lead`` (MAN: (G,) against (B, G)).
    own = (1,) * (rank - random_matrix.dim() + 2) + tuple(random_matrix.shape[:-2])
    per_matrix = [i for i in range(rank) if own[i] > 1]
    shared = [i for i in range(rank) if own[i] == 1]
    lengths = tuple(a.shape[-2] for a in features)
    return HadLayout(
        lead,
        (*per_matrix, *shared),
        math.prod([lead[i] for i in per_matrix]),
        math.prod([lead[i] for i in shared]),
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


def augmented_features(
    features: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    temperature: float,
    estimator: str,
    layout: HadLayout,
) -> tuple[Tensor, Tensor]:
    """The rows X of every modality, stacked along time, and the scale sigma > 0 of each
    sample and head such that sigma times a row times :func:`augmented_weights` is the
    exponent of the random features: B_j[t, h] = exp(sigma row_j[t] . column_h).

    With a~_j = s a_j, s = sqrt(temperature) (the temperature multiplies the logits):

    * ``"arf"`` (MAN Eq. 11): rows [a, -s |a|^2 / 2, 0] and sigma = s, so the exponent is
      w_h . a~ - |a~|^2 / 2.
    * ``"gerf"`` (the default): centred, generalised exponential features. With c_j the
      mean of a~_j over real steps, S = sum_j c_j and a'_j = a~_j - c_j,
      sum_{j<k} a~_j . a~_k = sum_{j<k} a'_j . a'_k + sum_j a'_j . (S - c_j) + const:
      the second part is a deterministic weight per step, only the pair products of the
      centred features are estimated. The exponent is
      B w . a' - |a'|^2 / 2 + a' . (S - c_j) - alpha |w|^2 (the last term in modality 0
      only), B = sqrt(1 + 2 alpha), alpha =
      :func:`~polyfuse.functional.random_features.gerf_alpha` of the data: the product over
      modalities is exp(-alpha |w|^2 + B w . u - sum_j |a'_j|^2 / 2 + ...) with
      u = sum_j a'_j, whose expectation over w ~ N(0, I) is
      (1 + 2 alpha)^(-K'/2) exp(sum_{j<k} a~_j . a~_k + const): the constants cancel in
      the ratio of Eq. 10 and 12. Written on the unscaled features a_j: m_j their mean,
      d_j = a_j - m_j (a'_j = s d_j), M = sum_j m_j, sigma = s B, rows
      [d, s^2 (d . (M - m_j) - |d|^2 / 2) / sigma, -alpha / sigma (modality 0) or 0].
      c_j and alpha are chosen per sample and head from the data; gradients flow through
      them (and sigma), so that the gradient is that of the computed output.

    Keeping sigma out of the rows costs nothing: the had steps multiply the exponent by it
    in the pass that subtracts the stabilisers. Without gradients the rows are written
    straight into the stacked tensor (one pass over the features per modality, besides
    the reductions); dot products, not matrix products, so that FLOP counts keep the
    method's two matrix products (except the mean over the real steps of a padded
    modality, a (1, T_j) product).

    Args:
        features: (..., T_j, K') per modality, padded steps zeroed.
        masks: (..., T_j) bool per modality, or None for a modality without padding.

    Returns:
        X (heads, rows, T, K' + 2) and sigma (heads, rows) of ``layout``.
    """
    feature_dim = features[0].shape[-1]
    scale = math.sqrt(temperature)
    ordered = [layout.lead[i] for i in layout.order]
    # Without gradients the rows are written straight into the stacked tensor (out=). With
    # them they are concatenated (out= is not differentiable, and in-place writes into views
    # of one tensor would each copy its whole gradient in the backward), and so they are
    # under torch.compile (which refuses a non-contiguous out=).
    in_place = not torch.compiler.is_compiling() and not (
        torch.is_grad_enabled() and any(a.requires_grad for a in features)
    )
    stacked = features[0].new_empty(*ordered, layout.offsets[-1], feature_dim + 2) if in_place else None
    arrays = [to_layout(a, layout, 2) for a in features]  # (*ordered, T_j, K') views
    targets = [
        None if stacked is None else stacked[..., start:stop, :feature_dim] for start, stop in spans(layout)
    ]
    if estimator == "arf":
        rows = [a if target is None else target.copy_(a) for a, target in zip(arrays, targets, strict=True)]
        # -|a~|^2 / 2 = sigma (-s |a|^2 / 2)
        weight = -0.5 * temperature * torch.cat([_squared_norms(a, in_place) for a in arrays], -1)
        sigma = arrays[0].new_full((*ordered, 1), scale)
        return _assemble(stacked, rows, torch.stack([weight, torch.zeros_like(weight)], -1), sigma, layout)
    real_masks = [None if mask is None else to_layout(mask, layout, 1) for mask in masks]
    means, counts = [], []  # m_j (*ordered, 1, K') and the number of real steps (*ordered, 1)
    for a, mask in zip(arrays, real_masks, strict=True):
        if mask is None:
            count = a.new_full((1,), a.shape[-2])
            real_sum = a.sum(-2, keepdim=True)
        else:  # the sum over real steps only, so that no gradient reaches padded ones
            weights = mask.to(a.dtype).unsqueeze(-2)  # (*ordered, 1, T_j)
            count = weights.sum(-1)
            real_sum = weights @ a
        counts.append(count)
        means.append(real_sum / count.unsqueeze(-1))
    total = means[0]
    for mean in means[1:]:
        total = total + mean  # M, (*ordered, 1, K')
    rows, spreads, crosses, squares = [], [], [], []
    for a, mean, mask, count, target in zip(arrays, means, real_masks, counts, targets, strict=True):
        centred = a - mean if target is None else torch.sub(a, mean, out=target)  # d_j
        rows.append(centred)
        square = _squared_norms(centred, in_place)  # |d_j[t]|^2, (*ordered, T_j)
        squares.append(square)
        crosses.append(torch.linalg.vecdot(centred, total - mean))  # d_j . (M - m_j)
        real = square if mask is None else square * mask
        spreads.append(temperature * real.sum(-1, keepdim=True) / count)  # mean_t |a'_j|^2
    alpha = random_features_module.gerf_alpha(spreads, feature_dim)  # (*ordered, 1)
    sigma = scale * torch.sqrt(1 + 2 * alpha)  # s B
    weight = temperature * (torch.cat(crosses, -1) - 0.5 * torch.cat(squares, -1))
    first = layout.lengths[0]  # -alpha |w|^2 in modality 0 only
    last = torch.cat([(-alpha).expand(*ordered, first), alpha.new_zeros(*ordered, layout.offsets[-1] - first)], -1)
    return _assemble(stacked, rows, torch.stack([weight, last], -1), sigma, layout)


def _squared_norms(x: Tensor, in_place: bool) -> Tensor:
    """|x|^2 over the last axis: without gradients (``in_place``) by vector_norm, one read
    and no temporary (vecdot multiplies into a temporary, then sums); with them by vecdot,
    whose backward costs less than the norm's."""
    return torch.linalg.vector_norm(x, dim=-1).square() if in_place else torch.linalg.vecdot(x, x)


def _assemble(
    stacked: Tensor | None, rows: Sequence[Tensor], columns: Tensor, sigma: Tensor, layout: HadLayout
) -> tuple[Tensor, Tensor]:
    """:func:`augmented_features`' result from the feature rows (written into ``stacked``
    already, or None: then concatenated) and the two extra columns (*ordered, T, 2) of the
    exponent, divided here by sigma (*ordered, 1)."""
    columns = columns / sigma.unsqueeze(-1)
    if stacked is None:
        stacked = torch.cat([torch.cat(list(rows), -2), columns], -1)
    else:
        stacked[..., -2:] = columns
    return (
        stacked.view(layout.heads, layout.rows, *stacked.shape[-2:]),
        sigma.reshape(layout.heads, layout.rows),
    )


def augmented_weights(random_matrix: Tensor, estimator: str, dtype: torch.dtype) -> Tensor:
    """(heads, K' + 2, H): W^T (with antithetic rows for ``"gerf"``), a row of ones and
    the row |w_h|^2, so that a row of :func:`augmented_features` times it is the
    exponent of the random features."""
    num_random_features, feature_dim = random_matrix.shape[-2:]
    matrices = random_matrix.to(dtype).reshape(-1, num_random_features, feature_dim)
    if estimator == "gerf":
        matrices = random_features_module.antithetic_rows(matrices)
    ones = matrices.new_ones(matrices.shape[0], 1, num_random_features)
    squared_norms = (matrices * matrices).sum(-1).unsqueeze(-2)
    return torch.cat([matrices.transpose(-1, -2), ones, squared_norms], dim=-2)


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


def stabilisers_for(exponent: Tensor, layout: HadLayout, scale: Tensor | None = None) -> Tensor:
    """Per modality j and feature h the largest exponent m_j[h] over real steps (note 5),
    with the rescaling weight exp(sum_j m_j[h] - max_h sum_j m_j[h]) folded into m_0.

    Args:
        exponent: (..., T, H), the modalities stacked along time, -inf at padded steps,
            to be multiplied by ``scale`` (..., 1, 1) > 0 (sigma of :func:`augmented_features`)
            if given.

    Returns:
        (..., m, H), the stabilisers of ``scale * exponent``, without gradient: the result
        does not depend on the stabilisers.
    """
    exponent = exponent.detach()
    if len(set(layout.lengths)) == 1:
        by_modality = exponent.unflatten(-2, (len(layout.lengths), layout.lengths[0]))
        stabilisers = max_over_steps(by_modality)
    else:
        stabilisers = torch.stack(
            [exponent[..., start:stop, :].amax(dim=-2) for start, stop in spans(layout)], dim=-2
        )
    if scale is not None:
        stabilisers.mul_(scale.detach())  # max_t sigma x = sigma max_t x for sigma > 0
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
    scale: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps on whole tensors, out of place: the path autograd differentiates."""
    heads, rows, total, _ = stacked_features.shape
    exponent = torch.matmul(stacked_features.view(heads, rows * total, -1), weights)
    scale = scale.view(heads, rows, 1, 1)
    exponent = exponent.view(heads, rows, total, -1) * scale  # Eq. 11 exponents, (G, N, T, H)
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
    scale: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps chunk by chunk, in place, in preallocated buffers (no gradients).

    ``stacked_features`` (G, N, T, K' + 2) and ``scale`` (G, N) from
    :func:`augmented_features`, ``values`` per modality (G, N, T_j, K).
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
                scale[span],
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
    scale: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    buffers: tuple[Tensor, Tensor, Tensor],
    output: Tensor,
    marginals: Sequence[Tensor],
) -> None:
    """One chunk of :func:`had_chunked`: (g, n, T, K' + 2) stacked features, (g, n) scale,
    values v_j^T as (g n, K, T_j); writes ``output`` (g, n, K) and, if given, ``marginals`` (g, n, T_j)."""
    heads, rows, total, feature_dim = stacked_features.shape
    num_random_features = weights.shape[-1]
    value_dim = values[0].shape[-2]
    count = heads * rows
    lengths, offsets = layout.lengths, layout.offsets
    num_modalities = len(lengths)
    exponent_buffer, product_buffer, term_buffer = buffers
    exponent = exponent_buffer[: count * total * num_random_features].view(heads, rows * total, -1)
    torch.bmm(stacked_features.view(heads, rows * total, feature_dim), weights, out=exponent)
    exponent = exponent.view(count, total, num_random_features)  # Eq. 11 exponents over sigma
    if padded is not None:
        exponent.masked_fill_(padded.reshape(count, total, 1), float("-inf"))  # B_j = 0 there
    scale = scale.reshape(count, 1, 1)
    stabilisers = stabilisers_for(exponent, layout, scale).neg_()  # -m_j, (g n, m, H), note 5
    if len(set(lengths)) == 1:
        by_modality = exponent.view(count, num_modalities, lengths[0], num_random_features)
        # sigma x - m_j in one pass, then B_j^T for every modality
        torch.addcmul(stabilisers.unsqueeze(2), by_modality, scale.unsqueeze(1), out=by_modality).exp_()
        sums = by_modality.sum(dim=2)  # B_j 1, (g n, m, H)
        random = by_modality.unbind(1)  # (g n, T_j, H) views
    else:
        for j, (start, stop) in enumerate(itertools.pairwise(offsets)):  # slices: no out= into them
            exponent[:, start:stop].mul_(scale).add_(stabilisers[:, j].unsqueeze(1))
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


class HadFunction(torch.autograd.Function):
    """The had output (Eq. 10 / Eq. 12) with a backward that recomputes, chunk by chunk,
    what the forward computed, instead of keeping the (G, N, T, H) random features:
    memory beyond the inputs and outputs is one chunk's, whatever T.

    Inputs: ``stacked_features`` X (G, N, T, F), ``weights`` W (G, F, H), ``scale`` sigma
    (G, N), ``padded`` (G, N, T) or None, ``layout``, then the m ``values`` (G, N, T_j, K).
    Output (G, N, K).

    Backward, per row (one sample and head), with the exponent sigma X W and
    E_j = exp(exponent_j - m_j) (T_j, H),
    P_j = E_j^T V_j (H, K), s_j = E_j^T 1 (H), y = sum_h prod_j P_j / sum_h prod_j s_j:
    dP_j = (dy / den) prod_{i != j} P_i, ds_j = -(dy . y / den) prod_{i != j} s_i,
    dE_j = V_j dP_j^T + 1 ds_j^T, dV_j = E_j dP_j, d exponent_j = dE_j * E_j,
    with D = d exponent W^T: dX = sigma D, dW = sigma X^T d exponent,
    d sigma = sum_t,h d exponent[t, h] (X W)[t, h] = sum_t X[t] . D[t]. The stabilisers m_j
    are constants: the output does not depend on them (note 5).
    """

    @staticmethod
    def forward(ctx, stacked_features, weights, scale, padded, layout, *values):
        ctx.save_for_backward(stacked_features, weights, scale, padded, *values)
        ctx.layout = layout
        output, _ = had_chunked(stacked_features, weights, scale, values, padded, layout, False)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return wrong zeros
            raise RuntimeError(
                'multilinear_attention(mode="had"): the backward is not differentiable '
                '(no second derivatives); use mode="exact" for double backward'
            )
        stacked_features, weights, scale, padded, *values = ctx.saved_tensors
        layout = ctx.layout
        with torch.no_grad():
            grads = had_backward(stacked_features, weights, scale, values, padded, layout, grad_output,
                                 ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        grad_stacked, grad_weights, grad_scale, grad_values = grads
        return (grad_stacked, grad_weights, grad_scale, None, None, *grad_values)


def had_backward(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    grad_output: Tensor,
    weights_need_grad: bool,
    scale_needs_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None, list[Tensor]]:
    """Gradients of :class:`HadFunction`, chunk by chunk (see its docstring); those of
    the weights and the scale only when asked (MAN's W is a buffer, ARF's scale a constant)."""
    heads, rows = stacked_features.shape[:2]
    num_random_features = weights.shape[-1]
    head_chunk, row_chunk = chunk_sizes(layout, num_random_features, weights)
    grad_stacked = torch.empty_like(stacked_features)
    grad_weights = torch.zeros_like(weights) if weights_need_grad else None
    grad_scale = scale.new_empty(scale.shape) if scale_needs_grad else None
    grad_values = [v.new_empty(v.shape) for v in values]  # contiguous, whatever the values' strides
    for head_start in range(0, heads, head_chunk):
        head_span = slice(head_start, min(heads, head_start + head_chunk))
        for row_start in range(0, rows, row_chunk):
            span = (head_span, slice(row_start, min(rows, row_start + row_chunk)))
            chunk_grads = had_chunk_backward(
                stacked_features[span],
                weights[head_span],
                scale[span],
                [v[span] for v in values],
                None if padded is None else padded[span],
                layout,
                grad_output[span],
                weights_need_grad,
                scale_needs_grad,
            )
            grad_stacked[span] = chunk_grads[0]
            if grad_weights is not None:
                grad_weights[head_span] += chunk_grads[1]
            if grad_scale is not None:
                grad_scale[span] = chunk_grads[2]
            for grad, chunk_grad in zip(grad_values, chunk_grads[3], strict=True):
                grad[span] = chunk_grad
    return grad_stacked, grad_weights, grad_scale, grad_values


def had_chunk_backward(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    values: Sequence[Tensor],
    padded: Tensor | None,
    layout: HadLayout,
    grad_output: Tensor,
    weights_need_grad: bool,
    scale_needs_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None, list[Tensor]]:
    """One chunk of :func:`had_backward`: (g, n, T, F) features, (g, F, H) weights, (g, n)
    scale, values (g, n, T_j, K), grad_output (g, n, K)."""
    heads, rows, total, feature_dim = stacked_features.shape
    num_random_features = weights.shape[-1]
    count = heads * rows
    scaled = (stacked_features * scale.view(heads, rows, 1, 1)).view(heads, rows * total, feature_dim)
    exponent = torch.bmm(scaled, weights).view(count, total, num_random_features)  # sigma X W
    if padded is not None:
        exponent.masked_fill_(padded.reshape(count, total, 1), float("-inf"))
    stabilisers = stabilisers_for(exponent, layout)  # (g n, m, H)
    # E_j = exp(exponent_j - m_j), in place: the exponents are not needed afterwards.
    random = [
        piece.sub_(stabiliser.unsqueeze(-2)).exp_()
        for piece, stabiliser in zip(
            exponent.split(list(layout.lengths), dim=-2), stabilisers.unbind(-2), strict=True
        )
    ]  # E_j, (g n, T_j, H)
    flat_values = [v.reshape(count, *v.shape[-2:]) for v in values]
    contracted = [b.transpose(-1, -2) @ v for b, v in zip(random, flat_values, strict=True)]  # P_j
    sums = [b.sum(dim=-2) for b in random]  # s_j, (g n, H)
    others_contracted = products_of_others(contracted)  # Q_j = prod_{i != j} P_i, (g n, H, K)
    others_sums = products_of_others(sums)
    numerator = (contracted[0] * others_contracted[0]).sum(dim=-2)  # (g n, K)
    denominator = (sums[0] * others_sums[0]).sum(dim=-1, keepdim=True)  # (g n, 1)
    output = numerator / denominator
    grad = grad_output.reshape(count, -1)
    grad_numerator = (grad / denominator).unsqueeze(-2)  # dy / den, (g n, 1, K)
    grad_denominator = -(grad * output).sum(-1, keepdim=True) / denominator  # (g n, 1)
    grad_exponent = torch.empty_like(exponent)
    grad_values = []
    for j, (start, stop) in enumerate(spans(layout)):
        # dP_j = (dy / den) * Q_j is never formed at (H, K): the scale over K moves to the
        # (T_j, K) side, V_j dP_j^T = (V_j * dy / den) Q_j^T and E_j dP_j = (E_j Q_j) * dy / den.
        grad_sums = (grad_denominator * others_sums[j]).unsqueeze(-2)  # ds_j, (g n, 1, H)
        scaled_values = flat_values[j] * grad_numerator  # (g n, T_j, K)
        grad_random = torch.baddbmm(grad_sums, scaled_values, others_contracted[j].transpose(-1, -2))
        grad_exponent[:, start:stop] = grad_random.mul_(random[j])  # dE_j * E_j, (g n, T_j, H)
        grad_values.append((random[j] @ others_contracted[j]).mul_(grad_numerator).view(values[j].shape))
    grad_exponent = grad_exponent.view(heads, rows * total, num_random_features)
    # D = d exponent W^T; dX = sigma D, d sigma = sum_t X[t] . D[t] (see HadFunction).
    projected = torch.bmm(grad_exponent, weights.transpose(-1, -2)).view(stacked_features.shape)
    grad_scale = None
    if scale_needs_grad:  # sum_t X[t] . D[t] per row, as a product (no temporary of X's size)
        flat_projected = projected.view(count, 1, total * feature_dim)
        grad_scale = torch.bmm(flat_projected, stacked_features.reshape(count, total * feature_dim, 1)).view(heads, rows)
    grad_stacked = projected.mul_(scale.view(heads, rows, 1, 1))
    grad_weights = None
    if weights_need_grad:
        grad_weights = torch.bmm(scaled.transpose(-1, -2), grad_exponent)
    return grad_stacked, grad_weights, grad_scale, grad_values


def products_of_others(tensors: Sequence[Tensor]) -> list[Tensor]:
    """For each j the element-wise product of all tensors but the j-th (prefix times
    suffix products: no division, exact with zeros)."""
    count = len(tensors)
    prefix = [None] * count
    suffix = [None] * count
    for j in range(1, count):
        prefix[j] = tensors[j - 1] if prefix[j - 1] is None else prefix[j - 1] * tensors[j - 1]
    for j in range(count - 2, -1, -1):
        suffix[j] = tensors[j + 1] if suffix[j + 1] is None else suffix[j + 1] * tensors[j + 1]
    result = []
    for before, after in zip(prefix, suffix, strict=True):
        if before is None:
            result.append(after)
        elif after is None:
            result.append(before)
        else:
            result.append(before * after)
    return result


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
