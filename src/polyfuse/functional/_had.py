"""The fast path of multi-linear attention's had mode (MAN Eq. 9 to 12).

:func:`polyfuse.functional.multilinear._had_attention` lays its inputs out with
:func:`had_layout`, the modalities stacked along one time axis (each modality's steps a
contiguous span, :func:`segments` says which), builds the random features' exponent rows with
:func:`augmented_features` (the estimator: MAN's ARF or the default centred generalised
features) and the columns with :func:`augmented_weights`, then runs :func:`had_chunked`
(without gradients: chunk by chunk, in place, in buffers that stay in cache),
:class:`HadFunction` (with gradients: the same forward, a backward that recomputes
chunk by chunk) or :func:`had_whole` (marginals with gradients: whole tensors, for
autograd). With MAN's LSC vectors computed exactly rather than estimated,
:func:`had_exact_lsc` (and :class:`ExactLscFunction`, its backward that recomputes)
sums over the C^m chunk tuples instead (docs/HAD_ESTIMATOR.md section 9). The tests
hold all of them to brute-force loops over tuples.

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
from polyfuse.functional.lsc_sum import LscSum, tuple_sum

__all__ = [
    "CHUNK_BYTES",
    "ESTIMATORS",
    "ExactLscFunction",
    "HadFunction",
    "HadLayout",
    "augmented_features",
    "augmented_weights",
    "augmented_weights_of",
    "dot_by_segment",
    "elementwise_product",
    "from_layout",
    "had_chunked",
    "had_exact_lsc",
    "had_layout",
    "had_whole",
    "in_layout",
    "max_over_steps",
    "random_features_in_place",
    "segment_sums",
    "segments",
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


def had_layout(lead: torch.Size, lengths: Sequence[int], random_matrix: Tensor) -> HadLayout:
    """The layout for inputs whose leading dims broadcast to ``lead``, modalities of ``lengths``."""
    rank = len(lead)
    # The random features' leading dims, right-aligned with ``lead`` (MAN: (G,) against (B, G)).
    own = (1,) * (rank - random_matrix.dim() + 2) + tuple(random_matrix.shape[:-2])
    per_matrix = [i for i in range(rank) if own[i] > 1]
    shared = [i for i in range(rank) if own[i] == 1]
    lengths = tuple(int(t) for t in lengths)
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


class Segments(NamedTuple):
    """Which modality each step of the stacked time axis belongs to.

    ``ids`` (T,) long: the modality of each step, for :func:`segment_sums` and for
    gathering per-modality quantities to the steps (``x.index_select(dim, ids)``);
    ``counts`` (m,) the lengths and ``minus_first`` (T,) -1 at the steps of modality 0,
    0 elsewhere, in the dtype asked for.
    """

    ids: Tensor
    counts: Tensor
    minus_first: Tensor


_SEGMENTS: dict[tuple, Segments] = {}


def segments(lengths: Sequence[int], dtype: torch.dtype, device: torch.device) -> Segments:
    """:class:`Segments` of modalities of ``lengths`` stacked along time. Built once per
    (lengths, dtype, device) and kept: a forward then spends no operation on them."""
    key = (tuple(lengths), dtype, str(device))
    cached = None if torch.compiler.is_compiling() else _SEGMENTS.get(key)
    if cached is not None:
        return cached
    ids = torch.tensor([j for j, length in enumerate(lengths) for _ in range(length)], device=device)  # static shape
    built = Segments(
        ids,
        torch.tensor(lengths, dtype=dtype, device=device),
        -(ids == 0).to(dtype),
    )
    if not torch.compiler.is_compiling() and len(_SEGMENTS) < 256:
        _SEGMENTS[key] = built
    return built


def segment_sums(x: Tensor, ids: Tensor, count: int, dim: int) -> Tensor:
    """Sums of ``x`` over the steps of each modality along ``dim`` (m = ``count`` entries
    there, step t counted in modality ``ids[t]``).

    An index_add rather than a product with an (m, T) indicator matrix, so that a FLOP
    count sees only the method's own multiply-adds; written as an autograd function
    because torch's index_add keeps ``x`` for its backward, while the gradient,
    ``grad.index_select(dim, ids)``, needs only ``ids`` (memory: one copy of the
    features less per layer).
    """
    return _SegmentSums.apply(x, ids, count, dim % x.dim())


class _SegmentSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, ids: Tensor, count: int, dim: int) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.dim = dim
        return x.new_zeros(*x.shape[:dim], count, *x.shape[dim + 1 :]).index_add_(dim, ids, x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (ids,) = ctx.saved_tensors
        return grad.index_select(ctx.dim, ids), None, None, None


def dot_by_segment(x: Tensor, vectors: Tensor, ids: Tensor) -> Tensor:
    """``x[..., t, :] . vectors[..., ids[t], :]`` for every step t: (..., T, K) and (..., m, K)
    -> (..., T). By hand (an autograd function) so that the backward keeps ``x`` and the
    m vectors but not the (..., T, K) gather of the vectors to the steps."""
    return _DotBySegment.apply(x, vectors, ids)


class _DotBySegment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, vectors: Tensor, ids: Tensor) -> Tensor:
        ctx.save_for_backward(x, vectors, ids)
        return torch.linalg.vecdot(x, vectors.index_select(-2, ids))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, vectors, ids = ctx.saved_tensors
        grad = grad.unsqueeze(-1)
        grad_x = grad * vectors.index_select(-2, ids) if ctx.needs_input_grad[0] else None
        grad_vectors = None
        if ctx.needs_input_grad[1]:  # sum over the steps of each modality of grad[t] x[t]
            grad_vectors = segment_sums(grad * x, ids, vectors.shape[-2], -2)
        return grad_x, grad_vectors, None


def augmented_features(
    features: Tensor,
    real: Tensor | None,
    temperature: float,
    estimator: str,
    lengths: Sequence[int],
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

    All modalities are handled at once on the stacked time axis: the per-modality sums
    are one :func:`segment_sums` each, and a modality's mean reaches its steps by one
    gather, so the number of operations does not grow with m.
    Rows of padded steps are never read (their exponent is -inf).

    Args:
        features: (G, N, T, K'), the modalities stacked along time, padded steps zeroed.
        real: (G or 1, N, T) bool, True at real steps, or None when nothing is padded.
        lengths: T_j of each modality (sum T).

    Returns:
        X (G, N, T, K' + 2) and sigma (G, N).
    """
    feature_dim = features.shape[-1]
    scale = math.sqrt(temperature)
    if estimator == "arf":
        # -|a~|^2 / 2 = sigma (-s |a|^2 / 2), sigma = s
        weight = (-0.5 * scale) * torch.linalg.vecdot(features, features)
        columns = torch.stack([weight, torch.zeros_like(weight)], -1)
        return torch.cat([features, columns], -1), features.new_full(features.shape[:-2], scale)
    segment = segments(lengths, features.dtype, features.device)
    count = len(lengths)
    # Per-modality sums over real steps (padded steps are zero, and their gradient is
    # zeroed where they were filled).
    sums = segment_sums(features, segment.ids, count, -2)  # (G, N, m, K')
    counts = segment.counts if real is None else segment_sums(real.to(features.dtype), segment.ids, count, -1)
    means = sums / counts.unsqueeze(-1)  # m_j, (G, N, m, K')
    total = means.sum(-2, keepdim=True)  # M, (G, N, 1, K')
    mean_at_step = means.index_select(-2, segment.ids)  # m_j at the steps of j, (G, N, T, K')
    centred = features - mean_at_step  # d_j
    square = torch.linalg.vecdot(centred, centred)  # |d_j[t]|^2, (G, N, T)
    cross = dot_by_segment(centred, total - means, segment.ids)  # d_j . (M - m_j)
    real_square = square if real is None else square * real
    spread = segment_sums(real_square, segment.ids, count, -1) / counts  # mean_t |d_j|^2, real steps, (G, N, m)
    alpha = random_features_module.gerf_alpha([temperature * spread.sum(-1, keepdim=True)], feature_dim)
    sigma = scale * torch.sqrt(1 + 2 * alpha)  # s B, (G, N, 1)
    weight = temperature * (cross - 0.5 * square)
    first = alpha * segment.minus_first  # -alpha |w|^2 enters in modality 0 only, (G, N, T)
    columns = torch.stack([weight, first], -1) / sigma.unsqueeze(-1)
    return torch.cat([centred, columns], -1), sigma.squeeze(-1)


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


def augmented_weights_of(
    random_matrix: Tensor, estimator: str, dtype: torch.dtype, columns: int | None = None
) -> Tensor:
    """:func:`augmented_weights`, kept on the random matrix while it does not change.

    A module's random matrix is a buffer that changes only in place (a redraw, a load),
    which bumps its version counter: the columns are rebuilt then and otherwise reused,
    so that a forward spends no operation on them. Not kept for a matrix that needs
    gradients, under ``torch.compile`` or for inference tensors (no version counter).
    ``columns``: use the first that many columns of the matrix only.
    """
    used = random_matrix if columns is None else random_matrix[..., :columns]
    if random_matrix.requires_grad or torch.compiler.is_compiling() or random_matrix.is_inference():
        return augmented_weights(used, estimator, dtype)
    key = (random_matrix._version, estimator, dtype, columns)
    kept = getattr(random_matrix, "_polyfuse_had_weights", None)
    if kept is not None and kept[0] == key:
        return kept[1]
    weights = augmented_weights(used, estimator, dtype)
    random_matrix._polyfuse_had_weights = (key, weights)
    return weights


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
    values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps on whole tensors, out of place: the path autograd differentiates.
    Arguments as :class:`HadFunction`'s."""
    values = values.split(list(layout.lengths), dim=-2)  # (G, N, T_j, K)
    random = random_features_out_of_place(stacked_features, weights, scale, padded, layout)  # B_j^T
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


def had_exact_lsc(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    chunk_of_step: Tensor,
    lsc: LscSum,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps with the LSC logits computed exactly rather than estimated.

    MAN's logits split into the learned part and the LSC part (Eq. 7 and 8):
    L_t = sum_{j<k} a_j . a_k + sum_{j<k} E(c_j) . E(c_k), where the LSC vectors E
    depend only on each step's chunk c_j in {0, .., C - 1}. So
    exp(L_t) = exp(learned_t) kappa(c_1, .., c_m), with kappa a fixed C^m table, and

        numerator_k = sum_c kappa(c) sum_h prod_j P_j[c_j, h, k],
        P_j[c, h, k] = sum_{t in chunk c of modality j} E_j[t, h] v_j[t, k],

    (the denominator likewise with v = 1): the random features estimate only the
    learned part, whose features' norms stay small, while the LSC part, whose codes
    carry most of the norm (e^2 per chunk entry), is summed over its C^m chunk tuples
    exactly, by histogram of chunks (:mod:`polyfuse.functional.lsc_sum`). Cost
    O(sum_j T_j H K C + W H K) per sample and head, W the histogram recursion's work
    (:attr:`~polyfuse.functional.lsc_sum.HistogramPlan.work`, 504 for m = 6, C = 4).

    Arguments as :func:`had_whole`'s (out of place, for autograd), with
    ``chunk_of_step`` (G or 1, N, T, C) one-hot chunk of each step (zero at padded
    steps) and ``lsc`` the histograms and their kappa (:func:`~polyfuse.functional.lsc_sum.lsc_sum_of`).
    Returns the output (G, N, K) and, if asked, the marginals (G, N, T_j).
    """
    heads, rows, total, _ = stacked_features.shape
    count = len(layout.lengths)
    random = random_features_out_of_place(stacked_features, weights, scale, padded, layout)  # E_j (G, N, T_j, H)
    chunk_of_step = chunk_of_step.expand(heads, rows, total, -1)
    chunks = chunk_of_step.split(list(layout.lengths), dim=-2)  # (G, N, T_j, C)
    num_chunks = chunk_of_step.shape[-1]
    value_dim = values.shape[-1]
    by_chunk = values_by_chunk(values, chunk_of_step, layout)
    factors = [chunk_factor(e, b, num_chunks) for e, b in zip(random, by_chunk, strict=True)]
    output, denominator = combine_chunk_factors(factors, lsc, value_dim)
    marginals = []
    if return_attention:
        # The LSC weight of chunk c of modality j times the other modalities' sums,
        # w_j[c, h] = sum_{c_-j} kappa(c, c_-j) prod_{i != j} s_i[c_i, h]: the contraction
        # with modality j's factor the identity over chunks (columns (c, h)).
        sums = [f.unflatten(-1, (-1, value_dim + 1))[..., value_dim] for f in factors]  # s_j, (G, N, C, H)
        identity = torch.eye(num_chunks, dtype=output.dtype, device=output.device)
        identity = identity.unsqueeze(-1).expand(-1, -1, sums[0].shape[-1]).flatten(-2)  # (C, C H)
        identity = identity.expand(*sums[0].shape[:-2], -1, -1)
        for j in range(count):
            tiled = [identity if i == j else s.repeat(1, 1, 1, num_chunks) for i, s in enumerate(sums)]
            weight = tuple_sum(tiled, lsc).unflatten(-1, (num_chunks, -1))  # (G, N, C, H)
            marginal = ((random[j] @ weight.transpose(-1, -2)) * chunks[j]).sum(-1)  # (G, N, T_j)
            marginals.append(marginal / denominator)
    return output, marginals


def values_by_chunk(values: Tensor, chunk_of_step: Tensor, layout: HadLayout) -> list[Tensor]:
    """Per modality the one-hot chunk of each step times [v, 1]: (..., T_j, C (K + 1)),
    so that one product with the random features gives every chunk's sums at once."""
    with_ones = torch.cat([values, values.new_ones(()).expand(*values.shape[:-1], 1)], -1)  # [v, 1]
    by_chunk = (chunk_of_step.unsqueeze(-1) * with_ones.unsqueeze(-2)).flatten(-2)
    return list(by_chunk.split(list(layout.lengths), dim=-2))


def chunk_factor(random: Tensor, by_chunk: Tensor, num_chunks: int) -> Tensor:
    """[P_j, s_j] of :func:`had_exact_lsc` for one modality: with E_j (..., T_j, H) and
    :func:`values_by_chunk`, (..., C, H (K + 1)) holding P_j[c, h, k] = sum_{t in chunk c}
    E_j[t, h] v_j[t, k] and, in the last column, s_j[c, h] = sum_{t in chunk c} E_j[t, h]."""
    product = random.transpose(-1, -2) @ by_chunk  # (..., H, C (K + 1))
    return product.unflatten(-1, (num_chunks, -1)).transpose(-2, -3).flatten(-2)


def combine_chunk_factors(
    factors: Sequence[Tensor], lsc: LscSum, value_dim: int
) -> tuple[Tensor, Tensor]:
    """The output of :func:`had_exact_lsc` from the chunk factors: sum over chunk tuples
    (weighted by kappa, :func:`~polyfuse.functional.lsc_sum.tuple_sum`) and over features h
    of the products over modalities, numerator (first K columns) over denominator (the
    last), Eq. 10 and 12; and the denominator."""
    combined = tuple_sum(factors, lsc).unflatten(-1, (-1, value_dim + 1)).sum(-2)
    denominator = combined[..., value_dim:]
    return combined[..., :value_dim] / denominator, denominator


class ExactLscFunction(torch.autograd.Function):
    """:func:`had_exact_lsc`'s output with a backward that recomputes the random features
    instead of keeping them (memory beyond the inputs and outputs: the (T, H) features
    of one call while the backward runs, none kept between forward and backward).

    Inputs as :class:`HadFunction`'s, with ``chunk_of_step`` (G or 1, N, T, C) and
    ``lsc`` of :func:`had_exact_lsc`. Backward: autograd through the small
    chunk-tuple combination gives dF_j (C, H (K + 1)) per modality; then, with
    b_j = one-hot chunk (x) [v_j, 1] per step (:func:`values_by_chunk`), the factor
    F_j = E_j^T b_j gives dE_j = b_j dF_j^T and db_j = E_j dF_j, whence dv_j[t] =
    sum_c onehot[t, c] db_j[t, c, :K]; d exponent = dE * E and the rest as
    :class:`HadFunction` (dX = sigma D, d sigma = sum_t X[t] . D[t], dW = sigma X^T d exponent).
    """

    @staticmethod
    def forward(ctx, stacked_features, weights, scale, values, padded, chunk_of_step, lsc, layout):
        ctx.layout, ctx.lsc = layout, lsc
        ctx.save_for_backward(stacked_features, weights, scale, values, padded, chunk_of_step)
        with torch.no_grad():
            random, by_chunk = _exact_lsc_parts(stacked_features, weights, scale, values, padded, chunk_of_step,
                                                layout)
            num_chunks = chunk_of_step.shape[-1]
            factors = [chunk_factor(e, b, num_chunks) for e, b in zip(random, by_chunk, strict=True)]
            output, _ = combine_chunk_factors(factors, lsc, values.shape[-1])
        return output.view(*stacked_features.shape[:2], -1)

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return wrong zeros
            raise RuntimeError(
                'multilinear_attention(mode="had"): the backward is not differentiable '
                '(no second derivatives); use mode="exact" for double backward'
            )
        stacked_features, weights, scale, values, padded, chunk_of_step = ctx.saved_tensors
        layout = ctx.layout
        heads, rows, total, _ = stacked_features.shape
        count = heads * rows
        num_chunks, value_dim = chunk_of_step.shape[-1], values.shape[-1]
        random, by_chunk = _exact_lsc_parts(stacked_features, weights, scale, values, padded, chunk_of_step,
                                            layout)
        factors = [chunk_factor(e, b, num_chunks).requires_grad_() for e, b in zip(random, by_chunk, strict=True)]
        with torch.enable_grad():  # the chunk-tuple combination only: small, (C, H (K + 1)) per modality
            output, _ = combine_chunk_factors(factors, ctx.lsc, value_dim)
            grad_factors = torch.autograd.grad(output, factors, grad_output.reshape(output.shape))
        grad_random, grad_values = [], []
        for e, b, grad in zip(random, by_chunk, grad_factors, strict=True):
            # dF_j (count, C, H (K + 1)) in the product's layout (count, H, C (K + 1))
            grad_product = grad.unflatten(-1, (-1, value_dim + 1)).transpose(-2, -3).flatten(-2)
            grad_random.append(b @ grad_product.transpose(-1, -2))  # dE_j = b_j dF_j^T, (count, T_j, H)
            grad_by_chunk = (e @ grad_product).unflatten(-1, (num_chunks, value_dim + 1))  # (count, T_j, C, K + 1)
            grad_values.append(grad_by_chunk[..., :value_dim])
        onehot = chunk_of_step.expand(heads, rows, total, -1).reshape(count, total, num_chunks)
        grad_values = (torch.cat(grad_values, 1) * onehot.unsqueeze(-1)).sum(-2)  # dv[t] = db[t, c(t), :K]
        grad_exponent = torch.cat(grad_random, 1).mul_(torch.cat(random, 1))  # (count, T, H)
        grad_stacked, grad_weights, grad_scale = gradients_through_exponent(
            grad_exponent, stacked_features, weights, scale, ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return (grad_stacked, grad_weights, grad_scale, grad_values.view(*stacked_features.shape[:3], value_dim),
                None, None, None, None)


def _exact_lsc_parts(stacked_features, weights, scale, values, padded, chunk_of_step, layout):
    """The random features E_j (G N, T_j, H) of the learned part and the chunked values
    of :func:`values_by_chunk` (G N, T_j, C (K + 1)), without gradients."""
    heads, rows, total, feature_dim = stacked_features.shape
    count = heads * rows
    exponent = torch.bmm(stacked_features.reshape(heads, rows * total, feature_dim), weights)
    if padded is not None:
        exponent.view(heads, rows, total, -1).masked_fill_(padded.unsqueeze(-1), float("-inf"))
    exponent = exponent.view(count, total, -1)
    random_features_in_place(exponent, scale.reshape(count, 1, 1), layout)  # exponent -> E
    onehot = chunk_of_step.expand(heads, rows, total, -1).reshape(count, total, -1)
    by_chunk = values_by_chunk(values.reshape(count, total, -1), onehot, layout)
    return list(exponent.split(list(layout.lengths), dim=1)), by_chunk


def random_features_out_of_place(
    stacked_features: Tensor, weights: Tensor, scale: Tensor, padded: Tensor | None, layout: HadLayout
) -> list[Tensor]:
    """The stabilised random features E_j (G, N, T_j, H) of every modality, out of place
    (for autograd): the Eq. 11 exponents sigma X W, -inf at padded steps (E_j = 0 there),
    less the stabilisers of :func:`stabilisers_for`."""
    heads, rows, total, _ = stacked_features.shape
    exponent = torch.matmul(stacked_features.view(heads, rows * total, -1), weights)
    exponent = exponent.view(heads, rows, total, -1) * scale.view(heads, rows, 1, 1)  # (G, N, T, H)
    if padded is not None:
        exponent = exponent.masked_fill(padded.unsqueeze(-1), float("-inf"))
    stabilisers = stabilisers_for(exponent, layout)  # (G, N, m, H)
    # split, not slices: the backward of a split is one concatenation, that of each
    # slice a zero tensor of the whole exponent's size.
    return [
        torch.exp(piece - stabiliser.unsqueeze(-2))
        for piece, stabiliser in zip(exponent.split(list(layout.lengths), dim=-2), stabilisers.unbind(-2),
                                     strict=True)
    ]


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
    values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    return_attention: bool,
) -> tuple[Tensor, list[Tensor]]:
    """The had steps chunk by chunk, in place, in preallocated buffers (no gradients).

    ``stacked_features`` (G, N, T, K' + 2) and ``scale`` (G, N) from
    :func:`augmented_features`, ``values`` (G, N, T, K) stacked like the features,
    ``padded`` (G or 1, N, T) True at padded steps, or None.
    """
    heads, rows, total, _ = stacked_features.shape
    num_random_features = weights.shape[-1]
    value_dim = values.shape[-1]
    head_chunk, row_chunk = chunk_sizes(layout, num_random_features, weights)
    if head_chunk == heads and row_chunk == rows:  # one chunk: no slicing, no buffers kept
        return had_chunk(stacked_features, weights, scale, values.transpose(-1, -2), padded, layout, None,
                         return_attention)
    capacity = head_chunk * row_chunk
    new = weights.new_empty
    buffers = (
        new(capacity * total * num_random_features),
        new(capacity * num_random_features * value_dim),
    )
    output = new(heads, rows, value_dim)
    marginals = [new(heads, rows, t) for t in layout.lengths] if return_attention else []
    transposed = values.transpose(-1, -2)  # v^T, (G, N, K, T)
    for head_start in range(0, heads, head_chunk):
        head_span = slice(head_start, min(heads, head_start + head_chunk))
        for row_start in range(0, rows, row_chunk):
            span = (head_span, slice(row_start, min(rows, row_start + row_chunk)))
            chunk_padded = None
            if padded is not None:
                chunk_padded = padded[:, span[1]] if padded.shape[0] == 1 else padded[span]
            chunk_output, chunk_marginals = had_chunk(
                stacked_features[span],
                weights[head_span],
                scale[span],
                transposed[span],
                chunk_padded,
                layout,
                buffers,
                return_attention,
            )
            output[span] = chunk_output
            for marginal, chunk_marginal in zip(marginals, chunk_marginals, strict=True):
                marginal[span] = chunk_marginal
    return output, marginals


def had_chunk(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    transposed_values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    buffers: tuple[Tensor, Tensor] | None,
    return_attention: bool,
    kept: dict[str, Tensor] | None = None,
) -> tuple[Tensor, list[Tensor]]:
    """One chunk of :func:`had_chunked`: (g, n, T, K' + 2) stacked features, (g, n) scale,
    values v^T (g, n, K, T), padded (g or 1, n, T) or None; the exponents and the
    products go to ``buffers`` if given (reused across chunks). Returns the output
    (g, n, K) and, if asked, the marginals (g, n, T_j). With ``kept`` (a dict), the random
    features E (g n, T, H) and their sums per modality (g n, m, H) are left in it for the
    backward."""
    heads, rows, total, feature_dim = stacked_features.shape
    num_random_features = weights.shape[-1]
    value_dim = transposed_values.shape[-2]
    count = heads * rows
    lengths = layout.lengths
    num_modalities = len(lengths)
    exponent = None if buffers is None else buffers[0][: count * total * num_random_features].view(heads, rows * total, -1)
    exponent = torch.bmm(stacked_features.reshape(heads, rows * total, feature_dim), weights, out=exponent)
    if padded is not None:  # B_j = 0 there
        exponent.view(heads, rows, total, -1).masked_fill_(padded.unsqueeze(-1), float("-inf"))
    exponent = exponent.view(count, total, num_random_features)  # Eq. 11 exponents over sigma
    scale = scale.reshape(count, 1, 1)
    sums = random_features_in_place(exponent, scale, layout)  # exponent -> B^T; B_j 1, (g n, m, H)
    if kept is not None:
        kept.update(random=exponent, sums=sums)
    random = exponent.split(list(lengths), dim=1)  # B_j^T, (g n, T_j, H) views
    values = transposed_values.reshape(count, value_dim, total).split(list(lengths), dim=-1)  # v_j^T (g n, K, T_j)
    # With v_j^T on the left the contractions produce (K, H), whose long rows suit the
    # matrix kernels better than (H, K).
    last = num_modalities - 1
    product = None if buffers is None else buffers[1][: count * num_random_features * value_dim].view(
        count, value_dim, num_random_features)
    product = torch.bmm(values[0], random[0], out=product)  # (B_0^T v_0)^T, Eq. 10
    for j in range(1, last):
        product.mul_(torch.bmm(values[j], random[j]))
    # sum_h product[k, h] (v^T B)[k, h] = sum_t v[t, k] (product B^T)[k, t], last modality
    mixed = torch.bmm(product, random[last].transpose(1, 2))  # (g n, K, T_last)
    numerator = mixed.mul_(values[last]).sum(dim=2)  # (g n, K)
    denominator = sums.prod(dim=1).sum(dim=-1, keepdim=True)  # sum A, Eq. 12, (g n, 1)
    output = numerator.div_(denominator).view(heads, rows, value_dim)
    marginals = []
    if return_attention:
        for j in range(num_modalities):
            others = elementwise_product([sums[:, i] for i in range(num_modalities) if i != j])  # (g n, H)
            weighted = torch.bmm(random[j], others.unsqueeze(-1)).squeeze(-1) / denominator
            marginals.append(weighted.view(heads, rows, -1))
    return output, marginals


def random_features_in_place(exponent: Tensor, scale: Tensor, layout: HadLayout) -> Tensor:
    """Turn the exponents over sigma (g n, T, H), -inf at padded steps, into the random
    features E_j = exp(sigma x - m_j) in place (m_j the stabilisers, note 5) and return
    their sums per modality B_j 1 (g n, m, H); ``scale`` is sigma, (g n, 1, 1). Shared by
    the forward and the backward, which must compute the same E."""
    lengths = layout.lengths
    count, _, num_random_features = exponent.shape
    stabilisers = stabilisers_for(exponent, layout, scale).neg_()  # -m_j, (g n, m, H)
    if len(set(lengths)) == 1:
        by_modality = exponent.view(count, len(lengths), lengths[0], num_random_features)
        # sigma x - m_j in one pass, then exp for every modality
        torch.addcmul(stabilisers.unsqueeze(2), by_modality, scale.unsqueeze(1), out=by_modality).exp_()
        return by_modality.sum(dim=2)
    segment = segments(lengths, exponent.dtype, exponent.device)
    # sigma x - m_j in one pass (m_j gathered to the steps of modality j), then exp
    torch.addcmul(stabilisers.index_select(1, segment.ids), exponent, scale, out=exponent).exp_()
    return segment_sums(exponent, segment.ids, len(lengths), 1)


class HadFunction(torch.autograd.Function):
    """The had output (Eq. 10 / Eq. 12) with a backward that recomputes, chunk by chunk,
    what the forward computed, instead of keeping the (G, N, T, H) random features:
    memory beyond the inputs and outputs is one chunk's, whatever T.

    Inputs: ``stacked_features`` X (G, N, T, F), ``weights`` W (G, F, H), ``scale`` sigma
    (G, N), ``values`` (G, N, T, K) stacked like X, ``padded`` (G or 1, N, T) or None,
    ``layout``. Output (G, N, K).

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
    def forward(ctx, stacked_features, weights, scale, values, padded, layout):
        ctx.layout = layout
        heads, rows = stacked_features.shape[:2]
        if chunk_sizes(layout, weights.shape[-1], weights) == (heads, rows):
            # One chunk: its random features and sums (within the chunk budget) are kept for
            # the backward, which then does not recompute them.
            kept: dict[str, Tensor] = {}
            with torch.no_grad():
                output, _ = had_chunk(stacked_features, weights, scale, values.transpose(-1, -2), padded,
                                      layout, None, False, kept)
            ctx.save_for_backward(stacked_features, weights, scale, values, padded, kept["random"], kept["sums"])
            return output
        ctx.save_for_backward(stacked_features, weights, scale, values, padded, None, None)
        output, _ = had_chunked(stacked_features, weights, scale, values, padded, layout, False)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return wrong zeros
            raise RuntimeError(
                'multilinear_attention(mode="had"): the backward is not differentiable '
                '(no second derivatives); use mode="exact" for double backward'
            )
        stacked_features, weights, scale, values, padded, random, sums = ctx.saved_tensors
        needs = (ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        with torch.no_grad():
            if random is not None:
                grads = had_chunk_backward(stacked_features, weights, scale, values, padded, ctx.layout,
                                           grad_output, *needs, random=random, sums=sums)
            else:
                grads = had_backward(stacked_features, weights, scale, values, padded, ctx.layout, grad_output,
                                     *needs)
        grad_stacked, grad_weights, grad_scale, grad_values = grads
        return grad_stacked, grad_weights, grad_scale, grad_values, None, None


def had_backward(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    grad_output: Tensor,
    weights_need_grad: bool,
    scale_needs_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """Gradients of :class:`HadFunction`, chunk by chunk (see its docstring); those of
    the weights and the scale only when asked (MAN's W is a buffer, ARF's scale a constant)."""
    heads, rows = stacked_features.shape[:2]
    num_random_features = weights.shape[-1]
    head_chunk, row_chunk = chunk_sizes(layout, num_random_features, weights)
    if head_chunk == heads and row_chunk == rows:  # one chunk: no slicing, no copies
        return had_chunk_backward(stacked_features, weights, scale, values, padded, layout, grad_output,
                                  weights_need_grad, scale_needs_grad)
    grad_stacked = torch.empty_like(stacked_features)
    grad_weights = torch.zeros_like(weights) if weights_need_grad else None
    grad_scale = scale.new_empty(scale.shape) if scale_needs_grad else None
    grad_values = values.new_empty(values.shape)  # contiguous, whatever the values' strides
    for head_start in range(0, heads, head_chunk):
        head_span = slice(head_start, min(heads, head_start + head_chunk))
        for row_start in range(0, rows, row_chunk):
            span = (head_span, slice(row_start, min(rows, row_start + row_chunk)))
            chunk_padded = None
            if padded is not None:
                chunk_padded = padded[:, span[1]] if padded.shape[0] == 1 else padded[span]
            chunk_grads = had_chunk_backward(
                stacked_features[span],
                weights[head_span],
                scale[span],
                values[span],
                chunk_padded,
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
            grad_values[span] = chunk_grads[3]
    return grad_stacked, grad_weights, grad_scale, grad_values


def had_chunk_backward(
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    values: Tensor,
    padded: Tensor | None,
    layout: HadLayout,
    grad_output: Tensor,
    weights_need_grad: bool,
    scale_needs_grad: bool,
    random: Tensor | None = None,
    sums: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    """One chunk of :func:`had_backward`: (g, n, T, F) features, (g, F, H) weights, (g, n)
    scale, values (g, n, T, K), padded (g or 1, n, T) or None, grad_output (g, n, K);
    the forward's random features E (g n, T, H) and their sums per modality (g n, m, H)
    if it kept them (else they are recomputed)."""
    heads, rows, total, feature_dim = stacked_features.shape
    num_random_features = weights.shape[-1]
    count = heads * rows
    lengths = list(layout.lengths)
    if random is None:
        exponent = torch.bmm(stacked_features.reshape(heads, rows * total, feature_dim), weights)  # X W
        if padded is not None:
            exponent.view(heads, rows, total, -1).masked_fill_(padded.unsqueeze(-1), float("-inf"))
        random = exponent.view(count, total, num_random_features)
        sums = random_features_in_place(random, scale.reshape(count, 1, 1), layout)  # E; s_j (g n, m, H)
    pieces = random.split(lengths, dim=1)  # E_j, (g n, T_j, H)
    flat_values = values.reshape(count, total, -1).split(lengths, dim=1)  # V_j, (g n, T_j, K)
    contracted = [torch.bmm(b.transpose(-1, -2), v) for b, v in zip(pieces, flat_values, strict=True)]  # P_j
    sums = sums.unbind(1)  # s_j, (g n, H)
    others_contracted = products_of_others(contracted)  # Q_j = prod_{i != j} P_i, (g n, H, K)
    others_sums = products_of_others(sums)
    numerator = (contracted[0] * others_contracted[0]).sum(dim=-2)  # (g n, K)
    denominator = (sums[0] * others_sums[0]).sum(dim=-1, keepdim=True)  # (g n, 1)
    output = numerator / denominator
    grad = grad_output.reshape(count, -1)
    grad_numerator = (grad / denominator).unsqueeze(-2)  # dy / den, (g n, 1, K)
    grad_denominator = -(grad * output).sum(-1, keepdim=True) / denominator  # (g n, 1)
    # d exponent_j = dE_j * E_j with dE_j = V_j dP_j^T + 1 ds_j^T; dP_j = (dy / den) * Q_j
    # is never formed at (H, K): the scale over K moves to the (T_j, K) side,
    # V_j dP_j^T = (V_j * dy / den) Q_j^T and dV_j = E_j dP_j = (E_j Q_j) * dy / den.
    grad_random = [
        torch.baddbmm((grad_denominator * s).unsqueeze(-2), v * grad_numerator, q.transpose(-1, -2))
        for v, q, s in zip(flat_values, others_contracted, others_sums, strict=True)
    ]
    grad_exponent = torch.cat(grad_random, 1).mul_(random)  # (g n, T, H)
    grad_values = torch.cat([torch.bmm(b, q) for b, q in zip(pieces, others_contracted, strict=True)], 1)
    grad_values.mul_(grad_numerator)
    grad_stacked, grad_weights, grad_scale = gradients_through_exponent(
        grad_exponent, stacked_features, weights, scale, weights_need_grad, scale_needs_grad)
    return grad_stacked, grad_weights, grad_scale, grad_values.view(values.shape)


def gradients_through_exponent(
    grad_exponent: Tensor,
    stacked_features: Tensor,
    weights: Tensor,
    scale: Tensor,
    weights_need_grad: bool,
    scale_needs_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """From d exponent (g n, T, H) of the exponents sigma X W to the gradients of the rows
    X (g, n, T, F), the weights W (g, F, H) and the scale sigma (g, n), the last two only
    when asked: with D = d exponent W^T, dX = sigma D, d sigma = sum_t X[t] . D[t] and
    dW = sigma X^T d exponent (see :class:`HadFunction`)."""
    heads, rows, total, feature_dim = stacked_features.shape
    count = heads * rows
    grad_exponent = grad_exponent.view(heads, rows * total, -1)
    projected = torch.bmm(grad_exponent, weights.transpose(-1, -2)).view(stacked_features.shape)  # D
    grad_scale = None
    if scale_needs_grad:  # sum_t X[t] . D[t] per row, as a product (no temporary of X's size)
        flat_projected = projected.view(count, 1, total * feature_dim)
        grad_scale = torch.bmm(flat_projected, stacked_features.reshape(count, total * feature_dim, 1)).view(heads, rows)
    grad_stacked = projected.mul_(scale.view(heads, rows, 1, 1))
    grad_weights = None
    if weights_need_grad:  # dW = sigma X^T d exponent
        scaled = (stacked_features * scale.view(heads, rows, 1, 1)).view(heads, rows * total, feature_dim)
        grad_weights = torch.bmm(scaled.transpose(-1, -2), grad_exponent)
    return grad_stacked, grad_weights, grad_scale


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
