"""High-order cross-modal attention (HOCA) and Low-Rank HOCA, as pure functions.

Reference: T. Jin, S. Huang, Y. Li, Z. Zhang. "Low-Rank HOCA: Efficient High-Order
Cross-Modal Attention for Video Captioning." EMNLP 2019 (``HOCA Eq. k`` below).

Legend for shapes: ``B`` batch, ``n`` number of modalities, ``T_i`` length of
modality i, ``d`` the common attention size (features already mapped with the
decoder query by the tanh layer of Eq. 3), ``d_q`` query size, ``d_f`` raw
feature size of one modality, ``k`` the rank of the low-rank weight.

Layout: the paper stores a modality as ``I_i in R^{d x t_i}`` (one column per
time step); here a modality is a (B, T_i, d) tensor (one row per time step), so
the paper's column ``(I_i)_r`` is our row ``features[i][:, r]``.

Masks are (B, T_i) bool tensors, True at real steps. Padded steps get exactly zero
attention and are zeroed before any sum over time, so they never enter the
correlation tensor (Eq. 7) nor the summaries ``B_l`` (Eq. 16), whatever they hold
(NaN included).

Where the PDF extraction was ambiguous we chose as follows:

* Section 4.1 maps every modality "similar to Eq. 3 with query h_t": we take the
  tanh layer of Eq. 3 without its score vector w_1, i.e. ``tanh(W h + U x_r + b)``
  in R^d (:func:`query_conditioned_features`); Fig. 2(b) shows exactly
  linear(d) then tanh before the tensor multiplication. Context vectors (Eq. 5)
  weight the *raw* features, as in section 3.
* Eq. 10, 12 and 13 print a garbled operator (a star) that multiplies the target
  step ``(I_l)_{r_l}`` into the first non-target modality only; all three are
  rewritings of the same slice ``(C_n^{I_l})_{r_l}[r_{-l}] = sum_d
  (I_l)_{r_l}[d] prod_{i != l} (I_i)_{r_i}[d]``, which is what both paths compute.
* Eq. 14 ``(I'_i)_j = (I_i ∘ w_j^{I_i}) 1_{t_i} = I_i (w_j^{I_i})^T`` scales the
  time steps of I_i by the factor and sums over time: a d-vector per rank term.
* Eq. 9 contracts the (n-1)-order slice ``(C_n^{I_l})_{r_l}`` of the correlation
  tensor with a weight tensor ``W^{I_l}_{n-1}`` of the same shape: the logit of
  step ``r_l`` is ``sum_{r_i, i != l} W[r_{-l}] C[r_1, ..., r_n]``; the softmax runs
  over the real steps of the target modality.
* Eq. 11's factors ``w_j^{I_i}`` carry no index of the target modality, and the
  complexity count of section 4.3 (``sum_i t_i x k`` trainable entries in the
  ``linear(t)`` layers) confirms that one factor matrix per modality is shared by
  all targets; :func:`low_rank_hoca_attention_all_targets` does exactly that.
* Eq. 17 replaces ``1_d`` of Eq. 15 by a learned d-vector ``w^{I_l}``: the logit
  is ``sum_d w[d] (I_l)_{r_l}[d] B_l[d]``. With ``w = 1_d`` Low-Rank HOCA equals
  HOCA whose weight is the CP sum of the same factors (note 9 of the papers'
  README); the tests check this to 1e-10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from polyfuse._checks import check_finite, check_masks, check_modality_list
from polyfuse.functional.pooling import masked_softmax

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "bahdanau_attention",
    "cp_weight_tensor",
    "high_order_correlation",
    "hoca_attention",
    "hoca_attention_all_targets",
    "low_rank_hoca_attention",
    "low_rank_hoca_attention_all_targets",
    "query_conditioned_features",
]

#: Default bound on the number of tensor elements the exact HOCA path may build.
DEFAULT_MAX_ELEMENTS = 2**26

MaskList = Sequence[Tensor | None] | None


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _prepare_features(
    features: Sequence[Tensor], masks: MaskList, what: str, *, min_count: int = 2
) -> tuple[list[Tensor], list[Tensor]]:
    """Validate n mapped modalities (B, T_i, d) and zero their padded steps.

    Returns the zeroed features and one (B, T_i) bool mask per modality.
    """
    check_modality_list(features, what, min_count=min_count)
    first = features[0]
    for i, x in enumerate(features):
        if x.dim() != 3:
            raise ValueError(
                f"{what}[{i}] (modality {i}) has shape {tuple(x.shape)}; expected (B, T_{i}, d)"
            )
        if not x.is_floating_point():
            raise ValueError(f"{what}[{i}] (modality {i}) has dtype {x.dtype}; expected a float")
        if x.shape[0] != first.shape[0] or x.shape[2] != first.shape[2]:
            raise ValueError(
                f"{what}[{i}] (modality {i}) has shape {tuple(x.shape)}, modality 0 has "
                f"{tuple(first.shape)}: all modalities need the same batch size B and the "
                "same common size d (map them with query_conditioned_features first)"
            )
        if x.dtype != first.dtype:
            raise ValueError(
                f"{what}[{i}] (modality {i}) has dtype {x.dtype}, modality 0 has {first.dtype}"
            )
        if x.shape[1] == 0:
            raise ValueError(f"{what}[{i}] (modality {i}) is an empty sequence (T = 0)")
    full_masks = check_masks(masks, features, f"{what} masks")
    zeroed = []
    for i, (x, mask) in enumerate(zip(features, full_masks, strict=True)):
        check_finite(x, f"{what}[{i}] (modality {i})", mask)
        zeroed.append(x.masked_fill(~mask.unsqueeze(-1), 0.0))
    return zeroed, full_masks


def _check_target(target: int, count: int) -> int:
    if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < count:
        raise ValueError(f"target must be a modality index in [0, {count - 1}], got {target!r}")
    return target


def _check_parameter(tensor: Tensor, expected: tuple[int, ...], what: str, like: Tensor) -> None:
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{what} must be a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{what} has shape {tuple(tensor.shape)}, expected {expected}")
    if tensor.dtype != like.dtype:
        raise ValueError(f"{what} has dtype {tensor.dtype}, the features have {like.dtype}")


# ---------------------------------------------------------------------------
# Unary (Bahdanau) attention, HOCA Eq. 2 to 5
# ---------------------------------------------------------------------------


def query_conditioned_features(
    query: Tensor,
    features: Tensor,
    *,
    query_weight: Tensor,
    feature_weight: Tensor,
    bias: Tensor | None = None,
) -> Tensor:
    """Map one modality into the common d-space with the decoder query (inside HOCA Eq. 3).

    ``tanh(W h + U (I)_r + b)`` for every time step r.

    Args:
        query: (B, d_q) decoder state h_t.
        features: (B, T, d_f) one modality.
        query_weight: (d, d_q), W of Eq. 3.
        feature_weight: (d, d_f), U of Eq. 3.
        bias: (d,) or None, b of Eq. 3.

    Returns:
        (B, T, d) mapped features.
    """
    if query.dim() != 2 or features.dim() != 3 or query.shape[0] != features.shape[0]:
        raise ValueError(
            f"query must be (B, d_q) and features (B, T, d_f) with the same B, got "
            f"{tuple(query.shape)} and {tuple(features.shape)}"
        )
    projected_query = query @ query_weight.T  # (B, d)
    if bias is not None:
        projected_query = projected_query + bias
    projected_features = features @ feature_weight.T  # (B, T, d)
    return torch.tanh(projected_features + projected_query.unsqueeze(1))  # HOCA Eq. 3


def bahdanau_attention(
    query: Tensor,
    features: Tensor,
    masks: Tensor | None = None,
    *,
    query_weight: Tensor,
    feature_weight: Tensor,
    score_vector: Tensor,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Additive (Bahdanau) attention of a decoder query over one modality, HOCA Eq. 2 to 5.

    This is the "unary" attention of the paper's multiple attentive fusion.

    Args:
        query: (B, d_q) decoder state h_t.
        features: (B, T, d_f) one modality I_l.
        masks: None or the (B, T) bool mask of this modality (True = real step).
        query_weight: (d, d_q), W_1 of Eq. 3.
        feature_weight: (d, d_f), U_1 of Eq. 3.
        score_vector: (d,), w_1 of Eq. 3.
        bias: (d,) or None, b_1 of Eq. 3.

    Returns:
        ``(attention, context)``: (B, T) weights, zero at padded steps and summing to
        one over the real ones (Eq. 2, 4), and the (B, d_f) context vector of Eq. 5,
        the attention-weighted sum of the *raw* features.
    """
    (zeroed,), (mask,) = _prepare_features(
        [features], None if masks is None else [masks], "bahdanau_attention features", min_count=1
    )
    if query.dim() != 2 or query.shape[0] != zeroed.shape[0]:
        raise ValueError(
            f"query has shape {tuple(query.shape)}; expected (B, d_q) with B = {zeroed.shape[0]}"
        )
    mapped = query_conditioned_features(
        query, zeroed, query_weight=query_weight, feature_weight=feature_weight, bias=bias
    )  # (B, T, d), Eq. 3 inside
    logits = mapped @ score_vector  # (B, T): e_r = w_1^T tanh(...), Eq. 3
    attention = masked_softmax(logits, mask)  # Eq. 2; sums to one (Eq. 4)
    context = torch.einsum("bt,btf->bf", attention, zeroed)  # Eq. 5
    return attention, context


# ---------------------------------------------------------------------------
# Exact HOCA, Eq. 7 to 9
# ---------------------------------------------------------------------------


def _sample_elements(lengths: Sequence[int], dim: int) -> tuple[int, int]:
    """Elements of one sample's correlation tensor and of its largest intermediate product."""
    correlation = math.prod(lengths)
    intermediate = dim * math.prod(lengths) // max(lengths) if len(lengths) > 2 else 0
    return correlation, intermediate


def _batch_chunk_size(zeroed: list[Tensor], max_elements: int, caller: str) -> int:
    """How many samples the exact path may process at once; refuses when one does not fit.

    The bound is on one sample's correlation tensor (T_1 x ... x T_n) plus its
    largest intermediate product: a batch that does not fit as a whole is split
    into chunks of as many samples as fit, so the batch size never causes a refusal.
    """
    _, _, dim = zeroed[0].shape
    lengths = [x.shape[1] for x in zeroed]
    correlation_size, intermediate_size = _sample_elements(lengths, dim)
    needed = correlation_size + intermediate_size
    if needed > max_elements:
        shape = " x ".join(str(s) for s in lengths)
        raise ValueError(
            f"{caller}: the exact HOCA correlation tensor of one sample (T_1 x ... x T_n = "
            f"{shape}) needs {needed:,} elements ({correlation_size:,} for the tensor, "
            f"{intermediate_size:,} for the intermediate product), more than "
            f"max_elements={max_elements:,} (the batch is split into chunks, but one sample "
            f"must fit); pass max_elements={needed} or more to allow it, or use "
            "low_rank_hoca_attention, whose cost is linear in the number of modalities"
        )
    return max(1, max_elements // needed)


def _build_correlation(zeroed: list[Tensor]) -> Tensor:
    """Eq. 7-8 on already zeroed (B, T_i, d) features, for the whole given batch."""
    batch, _, dim = zeroed[0].shape
    lengths = [x.shape[1] for x in zeroed]
    # Multiply the longest modality in last, so that the (B, d, ...) intermediate
    # that still carries the feature axis is as small as possible.
    order = sorted(range(len(zeroed)), key=lambda i: lengths[i])
    partial = zeroed[order[0]].transpose(1, 2)  # (B, d, T_a)
    for i in order[1:-1]:
        step = zeroed[i].transpose(1, 2)  # (B, d, T_i)
        step = step.reshape(batch, dim, *([1] * (partial.dim() - 2)), lengths[i])
        partial = partial.unsqueeze(-1) * step  # Hadamard product of Eq. 7, (B, d, T_a, ..., T_i)
    last = zeroed[order[-1]]  # (B, T_last, d)
    # Eq. 7: sum over d (the 1_d inner product) with the last modality.
    correlation = torch.bmm(partial.reshape(batch, dim, -1).transpose(1, 2), last.transpose(1, 2))
    correlation = correlation.reshape(batch, *[lengths[i] for i in order])
    return correlation.permute(0, *[1 + order.index(i) for i in range(len(zeroed))])


def _batch_chunks(zeroed: list[Tensor], max_elements: int, caller: str) -> list[list[Tensor]]:
    """The features split along the batch into chunks whose correlation tensors fit."""
    size = _batch_chunk_size(zeroed, max_elements, caller)
    pieces = [x.split(size, dim=0) for x in zeroed]
    return [list(chunk) for chunk in zip(*pieces, strict=True)]


def high_order_correlation(
    features: Sequence[Tensor],
    masks: MaskList = None,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Tensor:
    """The high-order correlation tensor C_n of n modalities, HOCA Eq. 7 and 8.

    ``C[b, r_1, ..., r_n] = sum_d prod_i features[i][b, r_i, d]``, zero wherever a
    step r_i is padded.

    Args:
        features: n >= 2 tensors (B, T_i, d), already mapped with the query.
        masks: None or one (B, T_i) bool tensor (or None) per modality.
        max_elements: bound on the elements built at once: one sample's tensor
            (T_1 x ... x T_n) and its largest intermediate product together must
            fit, or a ValueError gives the size; the batch is built in chunks of
            as many samples as fit (the returned tensor holds the whole batch).

    Returns:
        (B, T_1, ..., T_n).
    """
    zeroed, _ = _prepare_features(features, masks, "high_order_correlation features")
    chunks = _batch_chunks(zeroed, max_elements, "high_order_correlation")
    if len(chunks) == 1:
        return _build_correlation(zeroed)
    return torch.cat([_build_correlation(chunk) for chunk in chunks], dim=0)


def _weighted_correlation_logits(correlation: Tensor, target: int, weight: Tensor) -> Tensor:
    """Eq. 9 numerator exponent: contract the (n-1) non-target axes with ``weight``."""
    batch, target_length = correlation.shape[0], correlation.shape[1 + target]
    slices = correlation.movedim(1 + target, 1).reshape(batch, target_length, -1)  # (B, T_l, P)
    return slices @ weight.reshape(-1)  # (B, T_l): sum[W ∘ (C^{I_l})_{r_l}], Eq. 9


def _check_exact_weight(
    weight: Tensor, lengths: Sequence[int], target: int, like: Tensor, what: str
) -> None:
    expected = tuple(t for i, t in enumerate(lengths) if i != target)
    _check_parameter(weight, expected, f"{what} (T_i for every modality i != {target})", like)


def hoca_attention(
    features: Sequence[Tensor],
    target: int,
    weight: Tensor,
    masks: MaskList = None,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Tensor:
    """Exact high-order cross-modal attention of one target modality, HOCA Eq. 7 to 9.

    Builds the full correlation tensor (Eq. 7-8), contracts its slice at every
    step of the target with the weight tensor W^{I_target}_{n-1} and normalises
    over the target's real steps (Eq. 9).

    Args:
        features: n >= 2 tensors (B, T_i, d), already mapped with the query (Eq. 3).
        target: index l of the modality whose attention is returned.
        weight: (T_i for every i != target, in modality order), W^{I_l}_{n-1}.
        masks: None or one (B, T_i) bool tensor (or None) per modality.
        max_elements: bound on one sample's correlation tensor and intermediate
            product (see :func:`high_order_correlation`); the error gives the number
            of elements needed. Larger batches are processed in chunks of samples.

    Returns:
        (B, T_target) attention, zero at padded steps, summing to one over real ones.
    """
    zeroed, full_masks = _prepare_features(features, masks, "hoca_attention features")
    target = _check_target(target, len(zeroed))
    lengths = [x.shape[1] for x in zeroed]
    _check_exact_weight(weight, lengths, target, zeroed[0], "hoca_attention weight")
    logits = torch.cat(
        [
            _weighted_correlation_logits(_build_correlation(chunk), target, weight)
            for chunk in _batch_chunks(zeroed, max_elements, "hoca_attention")
        ],
        dim=0,
    )  # (B, T_l), one chunk of samples at a time
    return masked_softmax(logits, full_masks[target])  # Eq. 9


def hoca_attention_all_targets(
    features: Sequence[Tensor],
    weights: Sequence[Tensor],
    masks: MaskList = None,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> list[Tensor]:
    """:func:`hoca_attention` for every modality as target, sharing one correlation tensor.

    Args:
        features: n >= 2 tensors (B, T_i, d).
        weights: n tensors; ``weights[l]`` has shape (T_i for every i != l).
        masks: None or one (B, T_i) bool tensor (or None) per modality.
        max_elements: bound on one sample's correlation tensor, see :func:`hoca_attention`.

    Returns:
        n tensors (B, T_l): the attention of each modality (Eq. 9).
    """
    zeroed, full_masks = _prepare_features(features, masks, "hoca_attention features")
    lengths = [x.shape[1] for x in zeroed]
    check_modality_list(
        weights, "hoca_attention weights", min_count=len(zeroed), max_count=len(zeroed)
    )
    for target, weight in enumerate(weights):
        _check_exact_weight(weight, lengths, target, zeroed[0], f"hoca_attention weights[{target}]")
    logits: list[list[Tensor]] = [[] for _ in weights]
    for chunk in _batch_chunks(zeroed, max_elements, "hoca_attention_all_targets"):
        correlation = _build_correlation(chunk)  # one tensor shared by every target
        for target, weight in enumerate(weights):
            logits[target].append(_weighted_correlation_logits(correlation, target, weight))
    return [
        masked_softmax(torch.cat(parts, dim=0), full_masks[target])  # Eq. 9
        for target, parts in enumerate(logits)
    ]


def cp_weight_tensor(factors: Sequence[Tensor]) -> Tensor:
    """The CP (sum of rank-one) tensor of HOCA Eq. 11: ``sum_j outer_i factors[i][j]``.

    Args:
        factors: m >= 1 tensors of shape (k, T_i), the same rank k for all.

    Returns:
        (T_1, ..., T_m). With the non-target factors of a Low-Rank HOCA, this is the
        weight tensor W^{I_l}_{n-1} for which exact HOCA gives the same attention as
        Low-Rank HOCA with ``weight_vector = 1_d``.
    """
    check_modality_list(factors, "cp_weight_tensor factors", min_count=1)
    rank = factors[0].shape[0]
    for i, factor in enumerate(factors):
        if factor.dim() != 2 or factor.shape[0] != rank:
            raise ValueError(
                f"cp_weight_tensor factors[{i}] has shape {tuple(factor.shape)}; expected "
                f"(k, T_{i}) with the rank k = {rank} of factors[0]"
            )
    result = factors[0]  # (k, T_1)
    for factor in factors[1:]:
        result = result.unsqueeze(-1) * factor.reshape(rank, *([1] * (result.dim() - 1)), -1)
    return result.sum(dim=0)  # Eq. 11: sum over the rank


# ---------------------------------------------------------------------------
# Low-Rank HOCA, Eq. 14 to 17
# ---------------------------------------------------------------------------


def _check_factors(
    factors: Sequence[Tensor | None], lengths: Sequence[int], skip: int | None, like: Tensor
) -> int:
    """Validate one (k, T_i) factor per modality (the one at ``skip`` may be None)."""
    if (
        isinstance(factors, Tensor)
        or not isinstance(factors, Sequence)
        or len(factors) != len(lengths)
    ):
        raise ValueError(
            f"factors must be a list of {len(lengths)} tensors (k, T_i), one per modality"
        )
    rank = None
    for i, factor in enumerate(factors):
        if i == skip:
            continue
        if not isinstance(factor, Tensor) or factor.dim() != 2:
            raise ValueError(f"factors[{i}] (modality {i}) must be a (k, T_{i}) tensor")
        rank = factor.shape[0] if rank is None else rank
        _check_parameter(
            factor, (rank, lengths[i]), f"factors[{i}] (modality {i}, (k, T_{i}))", like
        )
    assert rank is not None
    return rank


def _temporal_summaries(
    zeroed: list[Tensor], factors: Sequence[Tensor | None], skip: int | None
) -> list[Tensor | None]:
    """HOCA Eq. 14: ``(I'_i)_j = I_i (w_j^{I_i})^T``, one (B, k, d) tensor per modality."""
    return [
        None if i == skip else torch.einsum("btd,kt->bkd", x, factors[i])  # Eq. 14
        for i, x in enumerate(zeroed)
    ]


def _low_rank_logits(
    target_features: Tensor, summary_product: Tensor, weight_vector: Tensor
) -> Tensor:
    """Eq. 15-17: B_l = sum_j prod_{i != l} (I'_i)_j; logits w^{I_l}[(I_l)_r ∘ B_l]."""
    summary = summary_product.sum(dim=1)  # (B, d), Eq. 16 (sum over the rank)
    return torch.einsum("btd,bd->bt", target_features, summary * weight_vector)  # Eq. 17


def low_rank_hoca_attention(
    features: Sequence[Tensor],
    target: int,
    factors: Sequence[Tensor | None],
    weight_vector: Tensor,
    masks: MaskList = None,
) -> Tensor:
    """Low-Rank HOCA attention of one target modality, HOCA Eq. 14 to 17.

    Cost O(k d sum_i T_i): linear in the number of modalities and in each length.

    Args:
        features: n >= 2 tensors (B, T_i, d), already mapped with the query (Eq. 3).
        target: index l of the modality whose attention is returned.
        factors: n entries; ``factors[i]`` (k, T_i) holds the rank-one factors
            w_1^{I_i}, ..., w_k^{I_i} of Eq. 11 for i != target; ``factors[target]``
            is ignored (it may be None).
        weight_vector: (d,), w^{I_l} of Eq. 17 (``1_d`` gives Eq. 15, i.e. exact HOCA
            with the weight ``cp_weight_tensor`` of the same factors).
        masks: None or one (B, T_i) bool tensor (or None) per modality; padded steps
            do not enter B_l and get zero attention.

    Returns:
        (B, T_target) attention, zero at padded steps, summing to one over real ones.
    """
    zeroed, full_masks = _prepare_features(features, masks, "low_rank_hoca_attention features")
    target = _check_target(target, len(zeroed))
    lengths = [x.shape[1] for x in zeroed]
    _check_factors(factors, lengths, target, zeroed[0])
    _check_parameter(weight_vector, (zeroed[0].shape[2],), "weight_vector (d,)", zeroed[0])
    summaries = _temporal_summaries(zeroed, factors, target)
    product = None
    for summary in summaries:
        if summary is not None:
            product = summary if product is None else product * summary  # Eq. 16, (B, k, d)
    logits = _low_rank_logits(zeroed[target], product, weight_vector)
    return masked_softmax(logits, full_masks[target])  # Eq. 17


def low_rank_hoca_attention_all_targets(
    features: Sequence[Tensor],
    factors: Sequence[Tensor],
    weight_vectors: Sequence[Tensor],
    masks: MaskList = None,
) -> list[Tensor]:
    """Low-Rank HOCA for every modality as target, with factors shared across targets.

    The summaries of Eq. 14 are computed once per modality and the products over
    ``i != l`` (Eq. 16) come from prefix and suffix products, so the whole call
    costs O(k d sum_i T_i + n k d): linear in the number of modalities.

    Args:
        features: n >= 2 tensors (B, T_i, d).
        factors: n tensors (k, T_i), the linear(t) layers of Fig. 2(c).
        weight_vectors: n tensors (d,), ``weight_vectors[l]`` is w^{I_l} of Eq. 17.
        masks: None or one (B, T_i) bool tensor (or None) per modality.

    Returns:
        n tensors (B, T_l): the attention of each modality (Eq. 17).
    """
    zeroed, full_masks = _prepare_features(features, masks, "low_rank_hoca_attention features")
    count = len(zeroed)
    _check_factors(factors, [x.shape[1] for x in zeroed], None, zeroed[0])
    check_modality_list(weight_vectors, "weight_vectors", min_count=count, max_count=count)
    for target, vector in enumerate(weight_vectors):
        _check_parameter(vector, (zeroed[0].shape[2],), f"weight_vectors[{target}] (d,)", zeroed[0])
    summaries = _temporal_summaries(zeroed, factors, None)  # Eq. 14, each (B, k, d)
    prefix = [None] * (count + 1)  # prefix[l] = prod_{i < l}, None for the empty product
    suffix = [None] * (count + 1)  # suffix[l] = prod_{i >= l}
    for i in range(count):
        prefix[i + 1] = summaries[i] if prefix[i] is None else prefix[i] * summaries[i]
    for i in reversed(range(count)):
        suffix[i] = summaries[i] if suffix[i + 1] is None else suffix[i + 1] * summaries[i]
    attentions = []
    for target in range(count):
        before, after = prefix[target], suffix[target + 1]  # prod_{i != target}, Eq. 16
        product = after if before is None else before if after is None else before * after
        logits = _low_rank_logits(zeroed[target], product, weight_vectors[target])  # Eq. 15-17
        attentions.append(masked_softmax(logits, full_masks[target]))
    return attentions
