"""Multi-linear pooling and multi-linear attention (MAN, Jin and Zhao, NeurIPS 2021).

Shapes: ``B`` batch (any number of leading dims, e.g. batch and heads), ``m`` number
of modalities, ``T_j`` length of modality j, ``K'`` attention feature size, ``K``
value size, ``H`` number of random features, ``C`` LSC chunks.

The attention over all prod_j T_j tuples of time steps (one per modality) is

    A = softmax_{t_1..t_m}( L[t_1, .., t_m] ),      f'_k = sum_t A[t] prod_j values_j[t_j, k]

(MAN Eq. 5), with the combinational additive (CAO) logits L = sum_{j<k} <a_j, a_k>
(Eq. 7; counted once per unordered pair, see note 1 of the papers' README). The
``"had"`` mode computes the same quantity at linear cost with positive random
features (Eq. 9 to 12); the ``"exact"`` and ``"hadamard"`` modes build the tensor.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import torch
from torch import Tensor

from polyfuse._checks import (
    check_all_finite,
    check_mask,
    check_masks,
    check_modality_list,
    check_stacked_steps,
)
from polyfuse._precision import float32_under_autocast
from polyfuse.functional import _had, lsc_sum

__all__ = [
    "AUTO_EXACT_TUPLES",
    "ESTIMATORS",
    "EXACT_LSC_WORK",
    "MODES",
    "attention_marginals",
    "lsc_chunk_of_steps",
    "lsc_encoding",
    "lsc_encoding_from_mask",
    "lsc_encoding_stacked",
    "multilinear_attention",
    "multilinear_pooling",
    "resolve_mode",
    "stacked_multilinear_attention",
]

MODES = ("exact", "hadamard", "had", "auto")
#: Default budget of ``mode="auto"``: the largest number of tuples per sample (heads x
#: prod_j T_j) whose attention tensor is computed exactly; beyond it, had mode.
AUTO_EXACT_TUPLES = 1 << 16
#: Largest work (:attr:`polyfuse.functional.lsc_sum.HistogramPlan.work`, products per
#: row and feature of the histogram recursion, whose intermediates the backward keeps)
#: for which had mode computes the LSC logits exactly (see
#: :func:`stacked_multilinear_attention`); beyond it they are estimated. About the cost of
#: the former limit, 4,096 chunk tuples (5,460 products by tuple): m <= 13 at C = 4
#: (m = 6: 504), m <= 4 at C = 10; the MAN paper's retrieval setting (m = 7, C = 10) needs
#: 80,080.
EXACT_LSC_WORK = 1 << 13
#: The random features of had mode (see :func:`multilinear_attention`).
ESTIMATORS = _had.ESTIMATORS
# Einsum letters for the time axes of up to 25 modalities ("k" is the channel axis).
_TIME_LETTERS = string.ascii_letters.replace("k", "")


def multilinear_pooling(
    inputs: Sequence[Tensor], projections: Sequence[Tensor], pooling: Tensor
) -> Tensor:
    """Low-rank multi-linear pooling f = P^T (U_1^T v_1 o ... o U_m^T v_m) (MAN Eq. 3).

    With m = 2 this is the low-rank bilinear pooling of BAN Eq. 2.

    Args:
        inputs: m tensors v_j of shape (..., d_j) with the same leading dims.
        projections: m matrices U_j of shape (d_j, d).
        pooling: P, shape (d, c).

    Returns:
        (..., c) tensor.
    """
    check_modality_list(inputs, "inputs", min_count=1)
    if len(projections) != len(inputs):
        raise ValueError(f"got {len(inputs)} inputs but {len(projections)} projections")
    joint = None
    for j, (v, u) in enumerate(zip(inputs, projections, strict=True)):
        if v.shape[-1] != u.shape[0]:
            raise ValueError(
                f"inputs[{j}] has feature size {v.shape[-1]} but projections[{j}] has "
                f"{u.shape[0]} rows"
            )
        if u.shape[1] != pooling.shape[0]:
            raise ValueError(
                f"projections[{j}] has rank {u.shape[1]} but pooling has {pooling.shape[0]} rows"
            )
        projected = v @ u
        joint = projected if joint is None else joint * projected  # Hadamard product, Eq. 3
    return joint @ pooling


def lsc_encoding(
    length: int,
    chunks: int,
    scale: float,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Local sequential constraint vectors E_t (MAN Eq. 8; note 3 of the papers' README).

    Step t falls in the relative chunk c(t) = floor(t * C / length); E_t holds
    ``+scale`` at positions i <= c(t) and ``-scale`` elsewhere, so that
    E_t1 . E_t2 = (C - 2 |c(t1) - c(t2)|) scale^2 decreases with the distance in
    chunks. Relative chunks let modalities of different lengths share the scale.

    Returns:
        (length, chunks) tensor.
    """
    if length <= 0 or chunks <= 0:
        raise ValueError(f"length and chunks must be positive, got {length} and {chunks}")
    positions = torch.arange(length, device=device)
    chunk_of_step = torch.div(positions * chunks, length, rounding_mode="floor")
    return _lsc_from_chunks(chunk_of_step, chunks, scale, dtype or torch.get_default_dtype())


def lsc_encoding_from_mask(mask: Tensor, chunks: int, scale: float, *, dtype: torch.dtype) -> Tensor:
    """LSC vectors for padded sequences: chunks relative to each sample's real length.

    Real steps are numbered in order (their rank among the real steps of the
    sample), so that padding, wherever it sits, changes neither the real steps'
    chunks nor their vectors; padded steps get zeros. For an all-True mask this
    equals :func:`lsc_encoding` row for row.

    Args:
        mask: (..., T) bool, True at real steps; every sample needs one.

    Returns:
        (..., T, chunks) tensor.
    """
    return lsc_encoding_stacked(mask, (mask.shape[-1],), chunks, scale, dtype=dtype)


def lsc_encoding_stacked(
    mask: Tensor, lengths: Sequence[int], chunks: int, scale: float, *, dtype: torch.dtype
) -> Tensor:
    """:func:`lsc_encoding_from_mask` of m modalities stacked along time, in one pass.

    Args:
        mask: (..., T) bool with T = sum_j T_j: modality j at the steps
            sum_{i<j} T_i .. sum_{i<=j} T_i - 1; its real steps are numbered within its span.
        lengths: T_j of each modality.

    Returns:
        (..., T, chunks): modality j's steps hold ``lsc_encoding_from_mask`` of its own mask.
    """
    encoding = _lsc_from_chunks(lsc_chunk_of_steps(mask, lengths, chunks), chunks, scale, dtype)
    return encoding * mask.unsqueeze(-1)


def lsc_chunk_of_steps(mask: Tensor, lengths: Sequence[int], chunks: int) -> Tensor:
    """The relative chunk c(t) in {0, .., C - 1} of every step of m modalities stacked
    along time (as :func:`lsc_encoding_stacked`): real steps are numbered within their
    modality's span and step number r of a modality with n real steps falls in chunk
    floor(r C / n); padded steps get chunk 0.

    Args:
        mask: (..., T) bool, T = sum_j T_j, True at real steps.

    Returns:
        (..., T) long.
    """
    ids = _had.segments(lengths, torch.long, mask.device).ids
    real = mask.long()
    counts = _had.segment_sums(real, ids, len(lengths), -1)  # real steps of each modality, (..., m)
    before = counts.cumsum(-1) - counts  # real steps of the modalities before j
    rank = real.cumsum(-1) - 1 - before.index_select(-1, ids)  # rank within j's real steps
    length = counts.clamp_min(1).index_select(-1, ids)
    return torch.div(rank.clamp_min(0) * chunks, length, rounding_mode="floor")


def _lsc_from_chunks(chunk_of_step: Tensor, chunks: int, scale: float, dtype: torch.dtype) -> Tensor:
    positions = torch.arange(chunks, device=chunk_of_step.device)
    plus = positions <= chunk_of_step.unsqueeze(-1)
    sign = plus.to(dtype) * 2 - 1
    return sign * scale


@float32_under_autocast
def multilinear_attention(
    features: Sequence[Tensor],
    values: Sequence[Tensor],
    masks: Sequence[Tensor | None] | None = None,
    *,
    mode: str,
    random_matrix: Tensor | None = None,
    temperature: float = 1.0,
    return_attention: bool = False,
    estimator: str = "gerf",
    exact_limit: int | None = None,
) -> Tensor | tuple[Tensor, Tensor | list[Tensor]]:
    """Multi-linear attention over m >= 2 modalities of unequal lengths (MAN Eq. 5).

    Args:
        features: m tensors a_j of shape (B, T_j, K'): the attention features
            U''_j^T v_j (with LSC vectors appended, if used).
        values: m tensors of shape (B, T_j, K): the values U'_j^T v_j. Features and
            values share one dtype; the leading dims B of all of them broadcast together.
        masks: None or m bool tensors broadcastable to (B, T_j), True at real steps.
            Padded steps get zero attention and their content is never read.
            Every sample needs at least one real step in every modality.
        mode: ``"exact"`` (CAO logits, Eq. 7, one softmax over the whole tensor),
            ``"hadamard"`` (the "w/o CAO" ablation: logits sum_k prod_j a_j[t_j, k]),
            or ``"had"`` (hierarchical approximation decomposition with positive
            random features, Eq. 9 to 12, cost O(sum_j H T_j K)), or ``"auto"``:
            exact while the tuples per sample, prod_j T_j times the leading dims
            after the first (the batch), are <= ``exact_limit`` (default
            :data:`AUTO_EXACT_TUPLES`), had beyond (:func:`resolve_mode`).
        random_matrix: W of shape (H, K') (or (..., H, K') broadcasting against
            B), one matrix shared by all modalities (note 2); required for ``"had"``.
        temperature: multiplies the logits (in ``"had"`` mode the features are
            scaled by its square root, which is the same thing); must be > 0 there.
        return_attention: also return the attention: in exact and hadamard modes
            the full tensor (B, T_1, ..., T_m); in had mode the list of per-modality
            marginals (B, T_j), each the sum of the estimated attention over all
            other modalities' steps, computed at linear cost.
        estimator: the random features of ``"had"`` mode. ``"gerf"`` (default):
            centred generalised exponential features with a variance-optimal
            parameter per sample and head and antithetic pairs of W's rows
            (:func:`polyfuse.functional._had.augmented_features`); its kernel
            variance is :func:`~polyfuse.functional.random_features.gerf_relative_variance`.
            ``"arf"``: MAN's addition random features (Eq. 11) as published, kept
            for comparison. Both are unbiased kernel estimates with the same cost.

    Returns:
        (B, K) tensor, or ``(output, attention)`` when ``return_attention``.

    Under ``torch.autocast`` the whole attention computes in float32 (autocast off,
    float16 / bfloat16 features, values and random matrix widened; float32 returned):
    had's exponentials, their stabilisers, the normalisers (numerator and denominator
    of Eq. 10 and 12) and the exact modes' softmax over all tuples would lose their
    digits in a low dtype. Features and values may then differ in dtype (e.g. float32
    LSC vectors beside bfloat16 projections); outside autocast they may not.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    check_modality_list(features, "features")
    check_modality_list(values, "values", min_count=len(features), max_count=len(features))
    lead: torch.Size = torch.Size()  # the batch dims of the modalities checked so far
    for j, (a, v) in enumerate(zip(features, values, strict=True)):
        if a.dim() < 2 or a.shape[-1] != features[0].shape[-1]:
            raise ValueError(
                f"features[{j}] (modality {j}) has shape {tuple(a.shape)}; expected "
                f"(B, T_{j}, K') with K' = {features[0].shape[-1]} like modality 0"
            )
        if v.shape[-2] != a.shape[-2] or v.shape[-1] != values[0].shape[-1]:
            raise ValueError(
                f"values[{j}] (modality {j}) has shape {tuple(v.shape)}; expected "
                f"(B, {a.shape[-2]}, K) with K = {values[0].shape[-1]} like modality 0"
            )
        if a.dtype != features[0].dtype or v.dtype != features[0].dtype:
            raise ValueError(
                f"modality {j}: features have dtype {a.dtype} and values {v.dtype}; expected "
                f"{features[0].dtype} for both, the dtype of modality 0's features"
            )
        try:
            lead = _broadcast_shape(lead, a.shape[:-2], v.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"modality {j}: batch dims of features {tuple(a.shape[:-2])} and values "
                f"{tuple(v.shape[:-2])} do not broadcast with each other and with "
                f"{tuple(lead)}, those of the modalities before it"
            ) from None
    full_masks = check_masks(masks, features)
    if mode == "auto":  # tuples per sample: the leading dims after the batch's
        batch = _broadcast_shape(lead, *(m.shape[:-1] for m in full_masks))
        mode = resolve_mode(mode, math.prod(batch[1:]) * math.prod(a.shape[-2] for a in features), exact_limit)
    check_all_finite([
        (t, f"{kind}[{j}] (modality {j})", mask)
        for j, (a, v, mask) in enumerate(zip(features, values, full_masks, strict=True))
        for t, kind in ((a, "features"), (v, "values"))
    ])
    # Zero padded steps so that whatever they hold can never reach the output (every
    # mask given is applied: skipping an all-True one would read it back to the host).
    given = masks or [None] * len(full_masks)
    features = [a if m is None else a.masked_fill(~mask.unsqueeze(-1), 0.0)
                for a, m, mask in zip(features, given, full_masks, strict=True)]
    values = [v if m is None else v.masked_fill(~mask.unsqueeze(-1), 0.0)
              for v, m, mask in zip(values, given, full_masks, strict=True)]
    if mode == "had":
        _check_had_options(random_matrix, features[0].shape[-1], lead, temperature, estimator)
        return _had_attention(
            features,
            values,
            [mask if m is not None else None for m, mask in zip(given, full_masks, strict=True)],
            random_matrix,
            temperature,
            return_attention,
            estimator,
        )
    logits = (
        _cao_logits(features) if mode == "exact" else _hadamard_logits(features)
    ) * temperature
    return _tensor_attention(logits, values, full_masks, return_attention)


def attention_marginals(attention: Tensor | list[Tensor], num_modalities: int) -> list[Tensor]:
    """Per-modality marginals (..., T_j) of multi-linear attention: had mode returns them
    (a list, handed back as it is); the exact and hadamard modes return the whole tensor
    (..., T_1, .., T_m), summed here over the other modalities' axes."""
    if isinstance(attention, list):
        return attention
    axes = range(-num_modalities, 0)
    return [attention.sum(dim=[axis for axis in axes if axis != own]) for own in axes]


def resolve_mode(mode: str, tuples: int, exact_limit: int | None = None) -> str:
    """The mode that ``mode`` computes for ``tuples`` = heads x prod_j T_j tuples per sample:
    ``"auto"`` is ``"exact"`` (the whole tensor of tuples, one softmax) when ``tuples``
    <= ``exact_limit`` (default :data:`AUTO_EXACT_TUPLES`, 2^16) and ``"had"`` beyond;
    any other mode is itself. Per sample, not per batch: both modes' time and memory
    grow linearly with the batch, so the batch does not move the crossover, and a
    model then computes the same mode in training and in evaluation whatever the batch
    sizes (a budget on batch x tuples made CMU-MOSI's MAN train exact on batches of 32
    and validate in had mode on batches of 256). The exact path's time and memory
    (a few tensors of batch x ``tuples`` numbers, kept for the backward) grow with
    prod_j T_j, had's with sum_j T_j (docs/HAD_ESTIMATOR.md section 10)."""
    if mode != "auto":
        return mode
    return "exact" if tuples <= (AUTO_EXACT_TUPLES if exact_limit is None else exact_limit) else "had"


@float32_under_autocast
def stacked_multilinear_attention(
    features: Tensor,
    values: Tensor,
    lengths: Sequence[int],
    mask: Tensor | None = None,
    *,
    mode: str,
    random_matrix: Tensor | None = None,
    temperature: float = 1.0,
    return_attention: bool = False,
    estimator: str = "gerf",
    chunks: int = 0,
    lsc_scale: float = 1.0,
    exact_lsc: bool = True,
    exact_limit: int | None = None,
) -> Tensor | tuple[Tensor, Tensor | list[Tensor]]:
    """:func:`multilinear_attention` of m modalities stacked along one time axis.

    The same attention (MAN Eq. 5), for callers that hold the modalities in one tensor
    (MAN's layer): modality j occupies the steps sum_{i<j} T_i .. sum_{i<=j} T_i - 1.
    Every step of the computation then handles all modalities at once, so that a call
    costs a number of operations that does not grow with m (fewer kernel launches).

    Args:
        features: (B, T, K'), T = sum_j T_j.
        values: (B, T, K); its leading dims broadcast with the features'.
        lengths: T_j of each modality (m >= 2).
        mask: None or bool (B, T) (broadcastable), True at real steps; every sample
            needs a real step in every modality.
        mode, random_matrix, temperature, return_attention, estimator: as for
            :func:`multilinear_attention`; with ``chunks`` > 0, random_matrix has
            K' + C columns (H, K' + C), like the features with the LSC vectors appended.
        chunks: C > 0 appends the LSC vectors of ``lsc_scale`` (MAN Eq. 8,
            :func:`lsc_encoding_stacked` of the mask) to the features; 0: none.
        exact_lsc: in had mode with chunks, compute the LSC part of the logits exactly
            over the C^m chunk tuples, by histogram of chunks (:mod:`polyfuse.functional.lsc_sum`,
            while its work is at most :data:`EXACT_LSC_WORK`), and estimate
            only the learned features' part with the random features (the first K'
            columns of random_matrix; :func:`polyfuse.functional._had.had_exact_lsc`).
            The LSC codes carry most of the features' norm (an entry of size e on
            every one of the C axes), and the random features' variance grows
            exponentially with that norm (docs/HAD_ESTIMATOR.md section 9). False, or
            C^m beyond the limit: the LSC vectors are estimated like the rest.
        exact_limit: the budget of ``mode="auto"`` (:func:`resolve_mode`): exact
            attention while the tuples per sample (prod_j T_j times the leading dims
            after the first, e.g. the heads) are <= exact_limit, had beyond.

    Returns:
        As :func:`multilinear_attention` (float32 under autocast, as it).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    lengths = [int(t) for t in lengths]
    if len(lengths) < 2 or min(lengths) < 1:
        raise ValueError(f"lengths: expected at least 2 modalities of positive length, got {lengths}")
    for name, tensor in (("features", features), ("values", values)):
        if tensor.dim() < 2 or tensor.shape[-2] != sum(lengths):
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}; expected (B, T, d) with T = {sum(lengths)}, "
                f"the sum of lengths {lengths}"
            )
    if features.dtype != values.dtype:
        raise ValueError(f"features have dtype {features.dtype} and values {values.dtype}; expected one dtype")
    try:
        lead = _broadcast_shape(features.shape[:-2], values.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dims of features {tuple(features.shape[:-2])} and values {tuple(values.shape[:-2])} "
            "do not broadcast"
        ) from None
    if mask is not None:
        mask = check_mask(mask, (*lead, sum(lengths)), "mask")
        check_stacked_steps(mask, lengths, "mask")
    if mode == "auto":  # tuples per sample: the leading dims after the batch's
        batch = _broadcast_shape(lead, () if mask is None else mask.shape[:-1])
        mode = resolve_mode(mode, math.prod(batch[1:]) * math.prod(lengths), exact_limit)
    check_all_finite([(features, "features", mask), (values, "values", mask)])
    if mask is not None:  # zero padded steps: whatever they hold never reaches the output
        padded = ~mask.unsqueeze(-1)
        features, values = features.masked_fill(padded, 0.0), values.masked_fill(padded, 0.0)
    chunk_of_step = exact_lsc_parts = None
    if chunks:
        if mode == "hadamard":
            raise ValueError("hadamard mode (w/o CAO) cannot use LSC; set chunks=0")
        real = features.new_ones(sum(lengths), dtype=torch.bool) if mask is None else mask
        chunk_of_step = lsc_chunk_of_steps(real, lengths, chunks)
        lsc = None
        if mode == "had" and exact_lsc:
            lsc = lsc_sum.lsc_sum_of(lengths, chunks, float(lsc_scale), float(temperature), features.dtype,
                                     features.device)
            lsc = lsc if lsc.plan.work <= EXACT_LSC_WORK else None
        if lsc is None:
            codes = _lsc_from_chunks(chunk_of_step, chunks, lsc_scale, features.dtype) * real.unsqueeze(-1)
            features = torch.cat([features, codes.expand(*features.shape[:-1], chunks)], -1)
            chunk_of_step = None  # estimated with the rest (had) or part of the exact logits
    if mode == "had":
        feature_dim = features.shape[-1] + (chunks if chunk_of_step is not None else 0)
        _check_had_options(random_matrix, feature_dim, lead, temperature, estimator)
        lead = _broadcast_shape(lead, random_matrix.shape[:-2], () if mask is None else mask.shape[:-1])
        layout = _had.had_layout(lead, lengths, random_matrix)

        def in_layout(tensor: Tensor, trailing: int) -> Tensor:  # (G, N, ...), a view where it can be
            arranged = _had.to_layout(tensor, layout, trailing)
            return arranged.reshape(layout.heads, layout.rows, *arranged.shape[arranged.dim() - trailing:])

        if chunk_of_step is not None:
            # one-hot by comparison (F.one_hot reads the largest chunk back to the host)
            onehot = chunk_of_step.unsqueeze(-1) == torch.arange(chunks, device=features.device)
            if mask is not None:
                onehot = onehot & mask.unsqueeze(-1)
            onehot = onehot.to(features.dtype)
            exact_lsc_parts = (in_layout(onehot, 2), lsc)
        return _had_stacked(in_layout(features, 2), in_layout(values, 2), None if mask is None else in_layout(mask, 1),
                            layout, random_matrix, temperature, return_attention, estimator, exact_lsc_parts)
    features_list, values_list = features.split(lengths, -2), values.split(lengths, -2)
    masks = [None] * len(lengths) if mask is None else list(mask.split(lengths, -1))
    full_masks = check_masks(masks, features_list)
    logits = (
        _cao_logits(features_list) if mode == "exact" else _hadamard_logits(features_list)
    ) * temperature
    return _tensor_attention(logits, values_list, full_masks, return_attention)


def _check_had_options(
    random_matrix: Tensor | None, feature_dim: int, lead: torch.Size, temperature: float, estimator: str
) -> None:
    if random_matrix is None:
        raise ValueError('mode="had" needs random_matrix, the random matrix W of shape (H, K\')')
    if random_matrix.shape[-1] != feature_dim:
        raise ValueError(
            f"random_matrix has rows of size {random_matrix.shape[-1]}, features have K' = {feature_dim}"
        )
    try:
        _broadcast_shape(lead, random_matrix.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"random_matrix has batch dims {tuple(random_matrix.shape[:-2])}, which do not "
            f"broadcast with the inputs' {tuple(lead)}"
        ) from None
    if not temperature > 0:
        raise ValueError(f'mode="had" needs temperature > 0, got {temperature}')
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {', '.join(ESTIMATORS)}")


def _broadcast_shape(*shapes: Sequence[int]) -> torch.Size:
    """``torch.broadcast_shapes`` for concrete sizes, without the symbolic-shape
    machinery that makes it cost about 0.1 ms a call; raises RuntimeError like it."""
    rank = max(len(shape) for shape in shapes)
    result = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, rank - len(shape)):
            if size != 1:
                if result[i] not in (1, size):
                    raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
                result[i] = size
    return torch.Size(result)


def _time_view(tensor: Tensor, axis_of: dict[int, int], num_modalities: int) -> Tensor:
    """Reshape (B, T_a[, T_b]) to broadcast over the m time axes of the attention tensor."""
    lead = tensor.dim() - len(axis_of)
    shape = list(tensor.shape[:lead]) + [1] * num_modalities
    for position, modality in enumerate(sorted(axis_of, key=axis_of.get)):
        shape[lead + modality] = tensor.shape[lead + position]
    return tensor.reshape(shape)


def _cao_logits(features: Sequence[Tensor]) -> Tensor:
    """CAO logits L[t] = sum_{j<k} <a_j[t_j], a_k[t_k]> (MAN Eq. 7, each pair once: note 1)."""
    m = len(features)
    logits = None
    for j in range(m):
        for k in range(j + 1, m):
            pair = features[j] @ features[k].transpose(-1, -2)  # (B, T_j, T_k)
            term = _time_view(pair, {j: 0, k: 1}, m)
            logits = term if logits is None else logits + term
    return logits


def _hadamard_logits(features: Sequence[Tensor]) -> Tensor:
    """"w/o CAO" logits L[t] = sum_k prod_j a_j[t_j, k] (continued Hadamard product)."""
    letters = _TIME_LETTERS[: len(features)]
    spec = ",".join(f"...{t}k" for t in letters) + f"->...{letters}"
    return torch.einsum(spec, *features)


def _tensor_attention(
    logits: Tensor, values: Sequence[Tensor], masks: Sequence[Tensor], return_attention: bool
) -> Tensor | tuple[Tensor, Tensor]:
    """One softmax over all tuples, then f'_k = sum_t A[t] prod_j values_j[t_j, k] (Eq. 5)."""
    m = len(values)
    joint_mask = None
    for j, mask in enumerate(masks):
        term = _time_view(mask, {j: 0}, m)
        joint_mask = term if joint_mask is None else joint_mask & term
    logits = logits.masked_fill(~joint_mask, float("-inf"))
    attention = torch.softmax(logits.flatten(-m), dim=-1).reshape(logits.shape)
    letters = _TIME_LETTERS[:m]
    spec = f"...{letters}," + ",".join(f"...{t}k" for t in letters) + "->...k"
    output = torch.einsum(spec, attention, *values)
    return (output, attention) if return_attention else output


def _had_attention(
    features: Sequence[Tensor],
    values: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    random_matrix: Tensor,
    temperature: float,
    return_attention: bool,
    estimator: str = "gerf",
) -> Tensor | tuple[Tensor, list[Tensor]]:
    """:func:`_had_stacked` of per-modality lists (what :func:`multilinear_attention`
    hands over: padded steps zeroed, and a mask per modality, or None for a modality
    without padding): each modality is laid out and all are stacked along time in one
    concatenation (one copy)."""
    lead = _broadcast_shape(*(a.shape[:-2] for a in features), *(v.shape[:-2] for v in values),
                            random_matrix.shape[:-2])
    layout = _had.had_layout(lead, [a.shape[-2] for a in features], random_matrix)

    def stack(tensors: Sequence[Tensor], trailing: int) -> Tensor:
        stacked = torch.cat([_had.to_layout(t, layout, trailing) for t in tensors], -trailing)
        return stacked.view(layout.heads, layout.rows, *stacked.shape[stacked.dim() - trailing:])

    real = None
    if any(mask is not None for mask in masks):
        real = stack([features[j].new_ones((), dtype=torch.bool).expand(t) if mask is None else mask
                      for j, (mask, t) in enumerate(zip(masks, layout.lengths, strict=True))], 1)
    return _had_stacked(stack(features, 2), stack(values, 2), real, layout, random_matrix, temperature,
                        return_attention, estimator)


def _had_stacked(
    features: Tensor,
    values: Tensor,
    real: Tensor | None,
    layout: _had.HadLayout,
    random_matrix: Tensor,
    temperature: float,
    return_attention: bool,
    estimator: str,
    exact_lsc: tuple[Tensor, Tensor] | None = None,
) -> Tensor | tuple[Tensor, list[Tensor]]:
    """Hierarchical approximation decomposition (MAN Eq. 9 to 12, appendix Algorithm 1).

    With B_j[t, h] = phi(a_j[t])_h the positive random features (Eq. 11),
    numerator f'_k = sum_h prod_j (B_j^T values_j)[h, k] (Eq. 10) and denominator
    sum A = sum_h prod_j (B_j^T 1)[h] (Eq. 12). Stabilisation (note 5): for every
    modality j and feature h the largest exponent m_j[h] over real steps is taken
    out, B_j = exp(exponent - m_j) <= 1; the products over modalities then carry
    the factor exp(sum_j m_j[h]), which is rescaled by its maximum over h. Both
    numerator and denominator are multiplied by the same constant, so the ratio is
    exactly the unstabilised one, and the denominator is >= 1 (never 0 or Inf).

    The random features are those of ``estimator`` (see
    :func:`polyfuse.functional._had.augmented_features`); every random matrix meets
    the rows of all modalities and all samples it serves in one matrix product, whose
    extra columns carry the deterministic per-step weights; the last modality's
    contraction is reordered: with R the product of the other modalities' (H, K)
    factors and B the (T, H) matrix of features, sum_h R[h, k] (B^T v)[h, k] =
    sum_t v[t, k] (B R)[t, k], so that the last factor is never stored. Without
    gradients the work runs chunk by chunk in buffers that stay in cache; with
    gradients :class:`~polyfuse.functional._had.HadFunction` runs the same forward
    and recomputes each chunk in its backward (memory independent of T); the
    marginals with gradients take the whole-tensor autograd path.

    Takes the modalities stacked along time and laid out by ``layout``: (G, N, T, K')
    features and (G, N, T, K) values with padded steps zeroed, and ``real`` (G, N, T) True
    at real steps, or None when nothing is padded. ``exact_lsc``: the one-hot chunk of
    every step (G or 1, N, T, C) and the LSC logits of the chunk tuples, when the LSC part
    is computed exactly (:func:`polyfuse.functional._had.had_exact_lsc`; the features
    then hold the learned part only, and the first K' columns of the random matrix serve).
    """
    differentiable = torch.is_grad_enabled() and any(
        tensor.requires_grad for tensor in (features, values, random_matrix)
    )
    columns = None if exact_lsc is None else features.shape[-1]
    weights = _had.augmented_weights_of(random_matrix, estimator, features.dtype, columns)
    stacked, scale = _had.augmented_features(features, real, temperature, estimator, layout.lengths)
    # (G, N, T, K' + 2) rows and (G, N) scale
    padded = None if real is None else ~real
    if exact_lsc is not None and differentiable and not return_attention:
        output, marginals = _had.ExactLscFunction.apply(stacked, weights, scale, values, padded, *exact_lsc,
                                                        layout), []
    elif exact_lsc is not None:
        output, marginals = _had.had_exact_lsc(stacked, weights, scale, values, padded, layout, *exact_lsc,
                                               return_attention)
    elif not differentiable:
        output, marginals = _had.had_chunked(stacked, weights, scale, values, padded, layout, return_attention)
    elif return_attention:
        output, marginals = _had.had_whole(stacked, weights, scale, values, padded, layout, True)
    else:
        output, marginals = _had.HadFunction.apply(stacked, weights, scale, values, padded, layout), []
    output = _had.from_layout(output, layout)
    if not return_attention:
        return output
    return output, [_had.from_layout(marginal, layout) for marginal in marginals]
