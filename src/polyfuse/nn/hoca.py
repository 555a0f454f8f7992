"""HOCA and Low-Rank HOCA as modules.

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

Multiple attentive fusion and the registry adapters live in :mod:`polyfuse.nn.maf`.

HOCA's weight tensors and Low-Rank HOCA's temporal factors have one entry per
time step, so both modules are built for maximum lengths (``max_lengths``); a
shorter or padded input uses the leading slice of each weight, and a longer one
is refused with a clear error. Padded steps get zero attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from polyfuse._checks import inputs_checked, prepare_fusion_inputs
from polyfuse.functional import hoca as hoca_functional
from polyfuse.functional.hoca import DEFAULT_MAX_ELEMENTS

__all__ = [
    "DEFAULT_LOW_RANK_MAX_LENGTH",
    "HOCA",
    "BahdanauAttention",
    "HOCAOutput",
    "LowRankHOCA",
    "MaxLengths",
    "Orders",
    "QueryConditionedMapping",
    "check_lengths",
    "check_query",
    "default_exact_max_length",
    "resolve_max_lengths",
    "weighted_sum",
]

#: Which attention orders :class:`~polyfuse.nn.MAF` uses (see ``parse_orders``).
Orders = str | int | Sequence[str | int]
#: Maximum length per modality: one int for all, one per modality, or None (a default).
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


def resolve_max_lengths(
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


def check_lengths(
    inputs: Sequence[Tensor], max_lengths: Sequence[int], owner: str, names: Sequence[int]
) -> None:
    for x, limit, name in zip(inputs, max_lengths, names, strict=True):
        if x.shape[1] > limit:
            raise ValueError(
                f"{owner}: modality {name} has {x.shape[1]} time steps, more than "
                f"max_lengths[{name}] = {limit}; build the module with a larger max_lengths "
                "(its weights have one entry per time step)"
            )


def check_query(query: Tensor, batch: int, query_dim: int, owner: str) -> None:
    if (
        not isinstance(query, Tensor)
        or query.dim() != 2
        or tuple(query.shape) != (batch, query_dim)
    ):
        shape = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
        raise ValueError(
            f"{owner}: query has shape {shape}, expected (B, d_q) = ({batch}, {query_dim})"
        )


def weighted_sum(attention: Tensor, features: Tensor) -> Tensor:
    """HOCA Eq. 5: (B, T) weights and (B, T, d_i) features -> (B, d_i) context."""
    return torch.einsum("bt,btf->bf", attention, features)


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
        check_query(query, sequences[0].shape[0], self.query_dim, owner)
        with inputs_checked():  # inputs checked once, here; the math below checks shapes only
            attention = self.attention(query, sequences, full_masks)
        context = [weighted_sum(a, x) for a, x in zip(attention, sequences, strict=True)]
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
            weight tensor here and for one sample's correlation tensor in every
            forward (a batch that does not fit as a whole runs in chunks of samples).

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
        lengths = resolve_max_lengths(
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
        check_lengths(inputs, self.max_lengths, "HOCA", range(len(inputs)))
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
        lengths = resolve_max_lengths(
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
        check_lengths(inputs, self.max_lengths, "LowRankHOCA", range(len(inputs)))
        mapped = self.mapping(query, inputs)  # Eq. 3
        factors = [f[:, : x.shape[1]] for f, x in zip(self.factors, inputs, strict=True)]
        return hoca_functional.low_rank_hoca_attention_all_targets(
            mapped, factors, list(self.weight_vectors), list(masks)
        )  # Eq. 14 to 17

    def extra_repr(self) -> str:
        return super().extra_repr() + f", rank={self.rank}"
