"""HOCA, Low-Rank HOCA and multiple attentive fusion (MAF) as modules.

Reference: T. Jin, S. Huang, Y. Li, Z. Zhang. "Low-Rank HOCA: Efficient High-Order
Cross-Modal Attention for Video Captioning." EMNLP 2019 (``HOCA Eq. k`` below).

Legend for shapes: ``B`` batch, ``n`` number of modalities, ``T_i`` length of
modality i, ``d_i`` its raw feature size, ``d_q`` query size, ``d`` the attention
size (``attention_dim``), ``O`` the output size.

The modules own the parameters and call :mod:`polyfuse.functional.hoca`:

* :class:`BahdanauAttention`: unary attention of one modality (Eq. 2 to 5).
* :class:`HOCA`, :class:`LowRankHOCA`: the query-conditioned mapping of every
  modality (Eq. 3), the n-th order attention of every modality (Eq. 9 or 17) and
  the context vectors (Eq. 5).
* :class:`MAF`: unary, binary, ... attentions combined per modality with trainable
  weights theta (Eq. 19), then attention over modalities (Eq. 20 to 23).
* :class:`HOCAFusion` (``"hoca"``) and :class:`LowRankHOCAFusion`
  (``"lowrank_hoca"``): MAF behind the common fusion interface, with a query that
  is either a learned vector or a pooled summary of the inputs.

HOCA's weight tensors and Low-Rank HOCA's temporal factors have one entry per
time step, so both modules are built for maximum lengths (``max_lengths``); a
shorter or padded input uses the leading slice of each weight, and a longer one
is refused with a clear error. Padded steps get zero attention.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from polyfuse._checks import prepare_fusion_inputs
from polyfuse.functional import hoca as hoca_functional
from polyfuse.functional.hoca import DEFAULT_MAX_ELEMENTS
from polyfuse.nn.base import FusionModule
from polyfuse.nn.registry import register

__all__ = [
    "DEFAULT_LOW_RANK_MAX_LENGTH",
    "HOCA",
    "MAF",
    "BahdanauAttention",
    "HOCAFusion",
    "HOCAOutput",
    "LowRankHOCA",
    "LowRankHOCAFusion",
    "MAFOutput",
    "QueryConditionedMapping",
    "default_exact_max_length",
    "parse_orders",
]

Orders = str | int | Sequence[str | int]
MaxLengths = int | Sequence[int] | None

#: Default maximum length of every modality for Low-Rank HOCA (cheap: k entries per step).
DEFAULT_LOW_RANK_MAX_LENGTH = 512
#: Exact HOCA's default maximum length, before the weight-size cap below lowers it.
_EXACT_LENGTH_CEILING = 64
#: Exact HOCA's default lengths keep every weight tensor at most this large.
_EXACT_DEFAULT_WEIGHT_ELEMENTS = 2**20


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def default_exact_max_length(order: int) -> int:
    """Default maximum length per modality for exact HOCA over ``order`` modalities.

    The largest L <= 64 whose weight tensor (L^(order-1) entries per target) has at
    most 2**20 entries: 64 up to four modalities, then 32, 16, 10, 7 for 5 to 8.
    """
    length = _EXACT_LENGTH_CEILING
    while length > 1 and length ** (order - 1) > _EXACT_DEFAULT_WEIGHT_ELEMENTS:
        length -= 1
    return length


def _resolve_max_lengths(
    max_lengths: int | Sequence[int] | None, count: int, default: int, owner: str
) -> list[int]:
    if max_lengths is None:
        return [default] * count
    if isinstance(max_lengths, int):
        max_lengths = [max_lengths] * count
    lengths = [int(length) for length in max_lengths]
    if len(lengths) != count or any(length <= 0 for length in lengths):
        raise ValueError(
            f"{owner}: max_lengths must be a positive int or {count} positive ints, got {max_lengths}"
        )
    return lengths


def _check_lengths(
    inputs: Sequence[Tensor], max_lengths: Sequence[int], owner: str, names: Sequence[int]
) -> None:
    for x, limit, name in zip(inputs, max_lengths, names, strict=True):
        if x.shape[1] > limit:
            raise ValueError(
                f"{owner}: modality {name} has {x.shape[1]} time steps, more than "
                f"max_lengths[{name}] = {limit}; build the module with a larger max_lengths "
                "(its weights have one entry per time step)"
            )


def _check_query(query: Tensor, batch: int, query_dim: int, owner: str) -> None:
    if (
        not isinstance(query, Tensor)
        or query.dim() != 2
        or tuple(query.shape) != (batch, query_dim)
    ):
        shape = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(
            f"{owner}: query has shape {shape}, expected (B, d_q) = ({batch}, {query_dim})"
        )


def _masked_softmax(logits: Tensor, mask: Tensor) -> Tensor:
    return logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def _weighted_sum(attention: Tensor, features: Tensor) -> Tensor:
    """HOCA Eq. 5: (B, T) weights and (B, T, d_i) features -> (B, d_i) context."""
    return torch.einsum("bt,btf->bf", attention, features)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """(B, T, d), (B, T) -> (B, d), the mean over real steps (x already zero at padding)."""
    count = mask.sum(dim=1, keepdim=True).clamp_min(1).to(x.dtype)
    return x.sum(dim=1) / count


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------


class QueryConditionedMapping(nn.Module):
    """Per-modality ``tanh(W_i h + U_i x_r + b_i)`` (HOCA Eq. 3, the linear(d) and tanh of Fig. 2).

    Args:
        input_dims: raw feature size d_i of each modality.
        query_dim: size d_q of the query h.
        attention_dim: common size d.

    ``forward(query (B, d_q), inputs [(B, T_i, d_i)]) -> [(B, T_i, d)]``.
    """

    def __init__(self, input_dims: Sequence[int], query_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.query_projections = nn.ModuleList(
            nn.Linear(query_dim, attention_dim) for _ in input_dims
        )  # W_i and b_i
        self.feature_projections = nn.ModuleList(
            nn.Linear(dim, attention_dim, bias=False) for dim in input_dims
        )  # U_i

    def forward(self, query: Tensor, inputs: Sequence[Tensor]) -> list[Tensor]:
        return [
            hoca_functional.query_conditioned_features(
                query,
                x,
                query_weight=query_projection.weight,
                feature_weight=feature_projection.weight,
                bias=query_projection.bias,
            )
            for x, query_projection, feature_projection in zip(
                inputs, self.query_projections, self.feature_projections, strict=True
            )
        ]


class BahdanauAttention(nn.Module):
    """Unary (Bahdanau) attention of a query over one modality, HOCA Eq. 2 to 5.

    Args:
        feature_dim: raw feature size d_i of the modality.
        query_dim: query size d_q.
        attention_dim: the size d of the tanh layer.

    ``forward(query (B, d_q), features (B, T, d_i), mask (B, T) bool or None)``
    returns ``(attention (B, T), context (B, d_i))``.
    """

    def __init__(self, feature_dim: int, query_dim: int, *, attention_dim: int = 64) -> None:
        super().__init__()
        self.query_projection = nn.Linear(query_dim, attention_dim)  # W_1, b_1
        self.feature_projection = nn.Linear(feature_dim, attention_dim, bias=False)  # U_1
        self.score_vector = nn.Parameter(torch.randn(attention_dim) / math.sqrt(attention_dim))

    def forward(
        self, query: Tensor, features: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        return hoca_functional.bahdanau_attention(
            query,
            features,
            mask,
            query_weight=self.query_projection.weight,
            feature_weight=self.feature_projection.weight,
            score_vector=self.score_vector,
            bias=self.query_projection.bias,
        )


class HOCAOutput(NamedTuple):
    """What :class:`HOCA` and :class:`LowRankHOCA` return."""

    attention: list[Tensor]  #: one (B, T_i) tensor per modality, Eq. 9 or 17
    context: list[Tensor]  #: one (B, d_i) tensor per modality, Eq. 5


class _HighOrderAttention(nn.Module):
    """Shared part of HOCA and Low-Rank HOCA: mapping, validation, context vectors."""

    def __init__(
        self,
        input_dims: Sequence[int],
        query_dim: int,
        attention_dim: int,
        max_lengths: list[int],
    ) -> None:
        super().__init__()
        self.input_dims = [int(dim) for dim in input_dims]
        if len(self.input_dims) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 modalities, got input_dims={self.input_dims}"
            )
        self.query_dim = int(query_dim)
        self.attention_dim = int(attention_dim)
        self.max_lengths = max_lengths
        self.mapping = QueryConditionedMapping(self.input_dims, query_dim, attention_dim)

    def forward(
        self,
        query: Tensor,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None = None,
    ) -> HOCAOutput:
        """Attention and context of every modality.

        Args:
            query: (B, d_q) decoder state h_t.
            inputs: n tensors (B, T_i, d_i), T_i <= max_lengths[i].
            masks: None or one (B, T_i) bool tensor (or None) per modality.
        """
        owner = type(self).__name__
        sequences, full_masks = prepare_fusion_inputs(inputs, masks, self.input_dims, owner)
        _check_query(query, sequences[0].shape[0], self.query_dim, owner)
        attention = self.attention(query, sequences, full_masks)
        context = [_weighted_sum(a, x) for a, x in zip(attention, sequences, strict=True)]
        return HOCAOutput(attention, context)

    def attention(
        self, query: Tensor, inputs: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> list[Tensor]:
        """One (B, T_i) attention per modality, for already validated inputs and masks."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (
            f"input_dims={self.input_dims}, query_dim={self.query_dim}, "
            f"attention_dim={self.attention_dim}, max_lengths={self.max_lengths}"
        )


class HOCA(_HighOrderAttention):
    """Exact high-order cross-modal attention over n >= 2 modalities, HOCA Eq. 3, 7 to 9, 5.

    Args:
        input_dims: raw feature size d_i of each modality.
        query_dim: query size d_q.
        attention_dim: the common size d of Eq. 3.
        max_lengths: maximum length of each modality (an int for all, or one per
            modality); None picks :func:`default_exact_max_length` (64 for up to
            four modalities). Target l owns a weight tensor W^{I_l}_{n-1} of shape
            (max_lengths[i] for i != l); shorter inputs use its leading slice.
        max_elements: the largest tensor this module may build: checked for every
            weight tensor here and for the correlation tensor in every forward.

    ``forward(query (B, d_q), inputs, masks)`` returns :class:`HOCAOutput`.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        query_dim: int,
        *,
        attention_dim: int = 64,
        max_lengths: MaxLengths = None,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        count = len(input_dims)
        lengths = _resolve_max_lengths(
            max_lengths, count, default_exact_max_length(count), type(self).__name__
        )
        super().__init__(input_dims, query_dim, attention_dim, lengths)
        self.max_elements = int(max_elements)
        weights = []
        for target in range(count):
            shape = [length for i, length in enumerate(lengths) if i != target]
            entries = math.prod(shape)
            if entries > self.max_elements:
                raise ValueError(
                    f"HOCA: the weight tensor of modality {target} would have {entries:,} "
                    f"entries (max_lengths {lengths}), more than max_elements="
                    f"{self.max_elements:,}; lower max_lengths, raise max_elements or use "
                    "LowRankHOCA"
                )
            # N(0, 1/P) over its P entries keeps the initial logits of order one or less.
            weights.append(nn.Parameter(torch.randn(shape) / math.sqrt(entries)))
        self.weights = nn.ParameterList(weights)  # W^{I_l}_{n-1} of Eq. 9, one per target l

    def attention(
        self, query: Tensor, inputs: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> list[Tensor]:
        _check_lengths(inputs, self.max_lengths, "HOCA", range(len(inputs)))
        lengths = [x.shape[1] for x in inputs]
        mapped = self.mapping(query, inputs)  # Eq. 3
        weights = [
            weight[tuple(slice(0, t) for i, t in enumerate(lengths) if i != target)]
            for target, weight in enumerate(self.weights)
        ]  # the leading slice for shorter inputs
        return hoca_functional.hoca_attention_all_targets(
            mapped, weights, list(masks), max_elements=self.max_elements
        )  # Eq. 7 to 9


class LowRankHOCA(_HighOrderAttention):
    """Low-Rank HOCA over n >= 2 modalities, HOCA Eq. 3, 14 to 17, 5.

    Args:
        input_dims: raw feature size d_i of each modality.
        query_dim: query size d_q.
        attention_dim: the common size d of Eq. 3.
        rank: k, the number of rank-one terms of Eq. 11 (the paper uses 1).
        max_lengths: maximum length of each modality (int or one per modality),
            default 512: modality i owns a (k, max_lengths[i]) factor matrix, the
            linear(t) layer of Fig. 2(c), shared by all targets (Eq. 11 gives the
            factors no index of the target).

    Each target l owns w^{I_l} (Eq. 17), initialised to ``1_d`` so that training
    starts from Eq. 15, i.e. from exact HOCA with a CP weight.

    ``forward(query (B, d_q), inputs, masks)`` returns :class:`HOCAOutput`.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        query_dim: int,
        *,
        attention_dim: int = 64,
        rank: int = 1,
        max_lengths: MaxLengths = None,
    ) -> None:
        count = len(input_dims)
        lengths = _resolve_max_lengths(
            max_lengths, count, DEFAULT_LOW_RANK_MAX_LENGTH, type(self).__name__
        )
        super().__init__(input_dims, query_dim, attention_dim, lengths)
        if rank <= 0:
            raise ValueError(f"LowRankHOCA: rank must be positive, got {rank}")
        self.rank = int(rank)
        self.factors = nn.ParameterList(
            nn.Parameter(torch.randn(self.rank, length) / math.sqrt(length)) for length in lengths
        )  # w_j^{I_i} of Eq. 11, one (k, T_i) matrix per modality
        self.weight_vectors = nn.ParameterList(
            nn.Parameter(torch.ones(attention_dim)) for _ in range(count)
        )  # w^{I_l} of Eq. 17

    def attention(
        self, query: Tensor, inputs: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> list[Tensor]:
        _check_lengths(inputs, self.max_lengths, "LowRankHOCA", range(len(inputs)))
        mapped = self.mapping(query, inputs)  # Eq. 3
        factors = [f[:, : x.shape[1]] for f, x in zip(self.factors, inputs, strict=True)]
        return hoca_functional.low_rank_hoca_attention_all_targets(
            mapped, factors, list(self.weight_vectors), list(masks)
        )  # Eq. 14 to 17

    def extra_repr(self) -> str:
        return super().extra_repr() + f", rank={self.rank}"


# ---------------------------------------------------------------------------
# Multiple attentive fusion, HOCA section 4.4
# ---------------------------------------------------------------------------

_ORDER_NAMES = {"u": 1, "unary": 1, "b": 2, "binary": 2, "t": None, "ternary": None}


def parse_orders(orders: Orders, num_modalities: int) -> list[tuple[int, ...]]:
    """The modality subsets that MAF attends with, from a description of the orders.

    Args:
        orders: a string of letters ``"U"`` (unary), ``"B"`` (binary), ``"T"``
            (ternary) such as ``"UBT"`` or ``"ub"``; or a sequence of names
            (``("unary", "binary", "ternary")``), letters or ints k (every subset of
            k modalities). ``"T"``/``"ternary"`` means all n modalities together,
            which is the paper's ternary attention for its three modalities (give
            the int 3 for every triple of more than three modalities).
        num_modalities: n.

    Returns:
        The distinct subsets (tuples of modality indices), by size then index;
        e.g. n = 3, ``"UBT"`` gives (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2).
    """
    count = int(num_modalities)
    if isinstance(orders, str):
        key = orders.strip().lower()
        items: list[str | int] = [key] if key in _ORDER_NAMES else list(key)
    elif isinstance(orders, int):
        items = [orders]
    else:
        items = list(orders)
    sizes = set()
    for item in items:
        if isinstance(item, str) and item.strip().lower() in _ORDER_NAMES:
            size = _ORDER_NAMES[item.strip().lower()]
            size = count if size is None else size
        elif isinstance(item, int) and not isinstance(item, bool):
            size = item
        else:
            raise ValueError(
                f"orders: unknown order {item!r} in {orders!r}; use the letters U, B, T, the "
                "names 'unary', 'binary', 'ternary', or ints k (subsets of k modalities)"
            )
        if not 1 <= size <= count:
            raise ValueError(f"orders: order {item!r} needs {size} modalities, there are {count}")
        sizes.add(size)
    if not sizes:
        raise ValueError("orders: give at least one order, e.g. 'UBT'")
    return [
        subset for size in sorted(sizes) for subset in itertools.combinations(range(count), size)
    ]


class MAFOutput(NamedTuple):
    """What :meth:`MAF.forward` returns with ``return_details=True``."""

    fused: Tensor  #: (B, O), sum_k beta_k D_t(k) of Eq. 22
    attention: list[Tensor]  #: one (B, T_i) tensor per modality, Eq. 19
    context: list[Tensor]  #: one (B, d_i) tensor per modality, Eq. 5
    modality_weights: Tensor  #: (B, n), beta of Eq. 20


class MAF(nn.Module):
    """Multiple attentive fusion (HOCA section 4.4, Fig. 3 and Eq. 19 to 23).

    For every chosen subset of modalities (every single one for unary, every pair
    for binary, all n together for ternary, ...) one attention module gives each
    member an attention over its steps: :class:`BahdanauAttention` for a single
    modality, :class:`HOCA` or :class:`LowRankHOCA` otherwise, each with its own
    parameters. Modality i combines the attentions of the subsets that contain it
    with trainable scalars theta (initialised to 1) and a softmax over its real
    steps (Eq. 19), which gives its context vector (Eq. 5). A second attention over
    the n contexts (Eq. 20, 21) weights their projections (Eq. 23) into the fused
    context ``sum_k beta_k W_p^k phi(k)`` (Eq. 22), returned without the decoder's
    ``W_p^h h_t + b_p`` term and softmax.

    Args:
        input_dims: raw feature size d_i of each modality.
        query_dim: query size d_q.
        out_dim: O, the size of the fused context.
        orders: which attention orders to use, see :func:`parse_orders`;
            ``"UBT"`` is the paper's HOCA-UBT.
        low_rank: use :class:`LowRankHOCA` (L-HOCA-*) instead of :class:`HOCA`.
        attention_dim: size d of every Eq. 3 tanh layer.
        fusion_dim: size of the tanh layer of Eq. 21 (default: attention_dim).
        rank: rank k of Low-Rank HOCA.
        max_lengths: maximum length per modality (int or one per modality); None
            picks 512 for low rank and :func:`default_exact_max_length` of the
            largest subset for exact HOCA.
        max_elements: memory bound of exact HOCA, see :class:`HOCA`.

    Interpretation: Eq. 21 writes one U_e for all modalities, possible in the paper
    because all its contexts have the same size; here each modality has its own
    U_e^i (d_i -> fusion_dim), while W_e, b_e and w_e are shared.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        query_dim: int,
        out_dim: int,
        *,
        orders: Orders = "UBT",
        low_rank: bool = False,
        attention_dim: int = 64,
        fusion_dim: int | None = None,
        rank: int = 1,
        max_lengths: MaxLengths = None,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        super().__init__()
        self.input_dims = [int(dim) for dim in input_dims]
        count = len(self.input_dims)
        if count < 1 or query_dim <= 0 or out_dim <= 0 or attention_dim <= 0:
            raise ValueError(
                f"MAF: sizes must be positive and at least one modality is needed, got "
                f"input_dims={self.input_dims}, query_dim={query_dim}, out_dim={out_dim}"
            )
        self.query_dim, self.out_dim, self.low_rank = int(query_dim), int(out_dim), bool(low_rank)
        self.subsets = parse_orders(orders, count)
        largest = max(len(subset) for subset in self.subsets)
        default = DEFAULT_LOW_RANK_MAX_LENGTH if low_rank else default_exact_max_length(largest)
        self.max_lengths = _resolve_max_lengths(max_lengths, count, default, "MAF")
        self.terms = nn.ModuleDict()
        for subset in self.subsets:
            dims = [self.input_dims[i] for i in subset]
            lengths = [self.max_lengths[i] for i in subset]
            if len(subset) == 1:
                term = BahdanauAttention(dims[0], query_dim, attention_dim=attention_dim)
            elif low_rank:
                term = LowRankHOCA(
                    dims, query_dim, attention_dim=attention_dim, rank=rank, max_lengths=lengths
                )
            else:
                term = HOCA(
                    dims,
                    query_dim,
                    attention_dim=attention_dim,
                    max_lengths=lengths,
                    max_elements=max_elements,
                )
            self.terms["_".join(str(i) for i in subset)] = term
        self._limited = sorted({i for subset in self.subsets if len(subset) > 1 for i in subset})
        # theta of Eq. 19: modality i has one scalar per subset containing it (subset order).
        self.order_weights = nn.ParameterList(
            nn.Parameter(torch.ones(sum(i in subset for subset in self.subsets)))
            for i in range(count)
        )
        fusion_dim = attention_dim if fusion_dim is None else int(fusion_dim)
        self.fusion_query = nn.Linear(query_dim, fusion_dim)  # W_e, b_e of Eq. 21
        self.fusion_contexts = nn.ModuleList(
            nn.Linear(dim, fusion_dim, bias=False) for dim in self.input_dims
        )  # U_e^i of Eq. 21
        self.fusion_score = nn.Parameter(torch.randn(fusion_dim) / math.sqrt(fusion_dim))  # w_e
        self.output_projections = nn.ModuleList(
            nn.Linear(dim, out_dim, bias=False) for dim in self.input_dims
        )  # W_p^k of Eq. 23

    def forward(
        self,
        query: Tensor,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None = None,
        *,
        return_details: bool = False,
    ) -> Tensor | MAFOutput:
        """Fused context for the decoder query.

        Args:
            query: (B, d_q) decoder state h_t.
            inputs: n tensors (B, T_i, d_i) (or (B, d_i) for one step).
            masks: None or one (B, T_i) bool tensor (or None) per modality.
            return_details: also return attentions, contexts and modality weights.

        Returns:
            (B, O), or a :class:`MAFOutput` when ``return_details``.
        """
        sequences, full_masks = prepare_fusion_inputs(inputs, masks, self.input_dims, "MAF")
        result = self.fuse_prepared(query, sequences, full_masks)
        return result if return_details else result.fused

    def fuse_prepared(
        self, query: Tensor, sequences: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> MAFOutput:
        """:meth:`forward` for inputs already validated, zero at padded steps, with bool masks."""
        _check_query(query, sequences[0].shape[0], self.query_dim, "MAF")
        _check_lengths(
            [sequences[i] for i in self._limited],
            [self.max_lengths[i] for i in self._limited],
            "MAF",
            self._limited,
        )
        per_modality: list[list[Tensor]] = [[] for _ in sequences]
        for subset, term in zip(self.subsets, self.terms.values(), strict=True):
            if len(subset) == 1:
                attention, _ = term(query, sequences[subset[0]], masks[subset[0]])  # Eq. 2-4
                attentions = [attention]
            else:
                attentions = term.attention(
                    query, [sequences[i] for i in subset], [masks[i] for i in subset]
                )  # Eq. 9 or 17, Eq. 18
            for i, attention in zip(subset, attentions, strict=True):
                per_modality[i].append(attention)
        fused_attention, contexts = [], []
        for i, (x, mask) in enumerate(zip(sequences, masks, strict=True)):
            stacked = torch.stack(per_modality[i], dim=-1)  # (B, T_i, terms of i)
            attention = _masked_softmax(stacked @ self.order_weights[i], mask)  # Eq. 19
            fused_attention.append(attention)
            contexts.append(_weighted_sum(attention, x))  # Eq. 5
        query_part = self.fusion_query(query)  # W_e h_t + b_e, (B, fusion_dim)
        scores = torch.stack(
            [
                torch.tanh(query_part + projection(context)) @ self.fusion_score
                for projection, context in zip(self.fusion_contexts, contexts, strict=True)
            ],
            dim=1,
        )  # (B, n), e_t^k of Eq. 21
        modality_weights = scores.softmax(dim=1)  # beta_t^k, Eq. 20
        projected = torch.stack(
            [
                projection(context)
                for projection, context in zip(self.output_projections, contexts, strict=True)
            ],
            dim=1,
        )  # (B, n, O), D_t(k) of Eq. 23
        fused = torch.einsum("bn,bno->bo", modality_weights, projected)  # Eq. 22
        return MAFOutput(fused, fused_attention, contexts, modality_weights)

    def extra_repr(self) -> str:
        return (
            f"input_dims={self.input_dims}, query_dim={self.query_dim}, out_dim={self.out_dim}, "
            f"subsets={self.subsets}, low_rank={self.low_rank}, max_lengths={self.max_lengths}"
        )


# ---------------------------------------------------------------------------
# Registry adapters
# ---------------------------------------------------------------------------


class _MAFFusion(FusionModule):
    """MAF behind the common interface, with a query built from the inputs or learned."""

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        query: str,
        query_dim: int | None,
        attention_dim: int,
        **maf_options: Any,
    ) -> None:
        super().__init__(input_dims, out_dim)
        query_dim = attention_dim if query_dim is None else int(query_dim)
        if query not in ("pooled", "learned"):
            raise ValueError(
                f"{type(self).__name__}: query must be 'pooled' or 'learned', got {query!r}"
            )
        self.query_mode = query
        if query == "pooled":
            # h = tanh(P [mean_1; ...; mean_n] + c): a summary of the real steps.
            self.query_projection = nn.Linear(sum(self.input_dims), query_dim)
        else:
            self.learned_query = nn.Parameter(torch.randn(query_dim))
        self.maf = MAF(
            self.input_dims, query_dim, out_dim, attention_dim=attention_dim, **maf_options
        )

    def make_query(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
        """The (B, d_q) query for validated inputs."""
        if self.query_mode == "learned":
            return self.learned_query.expand(inputs[0].shape[0], -1)
        pooled = torch.cat([_masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)], dim=-1)
        return torch.tanh(self.query_projection(pooled))

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self.maf.fuse_prepared(self.make_query(inputs, masks), inputs, masks).fused

    def extra_repr(self) -> str:
        return super().extra_repr() + f", query={self.query_mode!r}"


@register("hoca")
class HOCAFusion(_MAFFusion):
    """Exact HOCA with multiple attentive fusion behind the common fusion interface.

    ``forward(inputs [(B, T_i, d_i)], masks) -> (B, out_dim)``: the query is a
    pooled summary of the inputs (``query="pooled"``, tanh of a linear map of the
    masked means) or a learned vector (``query="learned"``); :class:`MAF` with
    ``orders`` (default ``"UBT"``, the paper's HOCA-UBT) does the rest.
    ``max_lengths`` bounds each modality's length (default
    :func:`default_exact_max_length` of the largest order: 64 for up to four
    modalities); longer inputs are refused with a clear error.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        orders: Orders = "UBT",
        attention_dim: int = 32,
        query: str = "pooled",
        query_dim: int | None = None,
        max_lengths: MaxLengths = None,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        super().__init__(
            input_dims,
            out_dim,
            query,
            query_dim,
            attention_dim,
            orders=orders,
            low_rank=False,
            max_lengths=max_lengths,
            max_elements=max_elements,
        )


@register("lowrank_hoca")
class LowRankHOCAFusion(_MAFFusion):
    """Low-Rank HOCA with multiple attentive fusion behind the common fusion interface.

    As :class:`HOCAFusion` with :class:`LowRankHOCA` terms of rank ``rank``
    (default 1, as in the paper: the defaults give its L-HOCA-UBT);
    ``max_lengths`` defaults to 512 per modality.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        orders: Orders = "UBT",
        attention_dim: int = 32,
        rank: int = 1,
        query: str = "pooled",
        query_dim: int | None = None,
        max_lengths: MaxLengths = None,
    ) -> None:
        super().__init__(
            input_dims,
            out_dim,
            query,
            query_dim,
            attention_dim,
            orders=orders,
            low_rank=True,
            rank=rank,
            max_lengths=max_lengths,
        )
