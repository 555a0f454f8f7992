"""Multiple attentive fusion (MAF, HOCA section 4.4 and Fig. 3) and the registry
adapters that put HOCA and Low-Rank HOCA behind the common fusion interface.

Reference: T. Jin, S. Huang, Y. Li, Z. Zhang. "Low-Rank HOCA: Efficient High-Order
Cross-Modal Attention for Video Captioning." EMNLP 2019 (``HOCA Eq. k`` below).

Legend for shapes: ``B`` batch, ``n`` number of modalities, ``T_i`` length of
modality i, ``d_i`` its raw feature size, ``d_q`` query size, ``d`` the attention
size (``attention_dim``), ``O`` the output size.

* :class:`MAF`: unary, binary, ... attentions combined per modality with trainable
  weights theta (Eq. 19), then attention over modalities (Eq. 20 to 23).

Eq. 19, ``alpha_t^F = softmax(theta_1 alpha_{t,1}^F + theta_2 alpha_{t,2}^{F,M} + ...)``,
taken literally applies a softmax to a weighted sum of *probabilities*: each term
lies in [0, 1] and sums to one over the T steps, so the softmax's inputs differ by
about ``sum_k theta_k / T`` and the result is close to uniform (``1/T`` per step,
whatever the terms attend to) until theta grows to the order of T. MAF therefore
offers two forms of Eq. 19 (``combination``):

* ``"log"`` (default): ``softmax(sum_k theta_k log alpha_k)``, the normalised
  weighted geometric mean of the terms. Since ``log alpha_k = e_k - logsumexp(e_k)``
  and softmax ignores a constant per sample, this equals the softmax of the
  theta-weighted *logits* e_k of the terms (Eq. 3, 9, 17): with one term and
  theta = 1 it returns that term's attention unchanged, so the terms' sharpness
  survives the fusion and the model learns where to look.
* ``"literal"``: Eq. 19 as printed, ``softmax(sum_k theta_k alpha_k)``.

``polyfuse bench maf`` measures both (attention entropy and captioning metrics
on MSVD); the figures are in docs/BENCHMARKS.md.
* :class:`HOCAFusion` (``"hoca"``) and :class:`LowRankHOCAFusion`
  (``"lowrank_hoca"``): MAF behind the common fusion interface, with a query that
  is either a learned vector or a pooled summary of the inputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from polyfuse._checks import inputs_checked, prepare_fusion_inputs
from polyfuse._precision import empty_output, float32_call, needs_float32, widen_under_autocast
from polyfuse.functional.hoca import DEFAULT_MAX_ELEMENTS
from polyfuse.functional.pooling import masked_mean, masked_softmax
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.hoca import (
    DEFAULT_LOW_RANK_MAX_LENGTH,
    HOCA,
    BahdanauAttention,
    LowRankHOCA,
    MaxLengths,
    Orders,
    check_lengths,
    check_query,
    default_exact_max_length,
    resolve_max_lengths,
    weighted_sum,
)
from polyfuse.nn.registry import register

__all__ = [
    "EQ19_COMBINATIONS",
    "MAF",
    "HOCAFusion",
    "LowRankHOCAFusion",
    "MAFFusion",
    "MAFOutput",
    "combine_attentions",
    "parse_orders",
]

#: The forms of HOCA Eq. 19 that :class:`MAF` offers (see the module docstring).
EQ19_COMBINATIONS = ("log", "literal")


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


def combine_attentions(
    attentions: Tensor, theta: Tensor, mask: Tensor, combination: str = "log"
) -> Tensor:
    """HOCA Eq. 19: one modality's attention from its unary, binary, ... attentions.

    Args:
        attentions: (B, T, K) the K attentions of the modality (each zero at padded
            steps and summing to one over the real ones).
        theta: (K,) the trainable weights theta_1..K of Eq. 19.
        mask: (B, T) bool, True at real steps.
        combination: ``"log"``, ``softmax(sum_k theta_k log alpha_k)`` (equal to the
            softmax of the theta-weighted logits of the terms), or ``"literal"``,
            ``softmax(sum_k theta_k alpha_k)`` as Eq. 19 is printed.

    Returns:
        (B, T) attention, zero at padded steps, summing to one over the real ones.
    """
    if combination == "literal":
        scores = attentions @ theta  # Eq. 19 as printed: a softmax over weighted probabilities
    elif combination == "log":
        # Eq. 19 on log-attentions; clamping keeps an underflowed probability finite.
        tiny = torch.finfo(attentions.dtype).tiny
        logs = attentions.clamp_min(tiny).log().masked_fill(~mask.unsqueeze(-1), 0.0)
        scores = logs @ theta
    else:
        raise ValueError(
            f"MAF: combination must be one of {EQ19_COMBINATIONS} (HOCA Eq. 19), got "
            f"{combination!r}"
        )
    return masked_softmax(scores, mask)  # Eq. 19


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
    steps (Eq. 19, in the form ``combination``, see :func:`combine_attentions`),
    which gives its context vector (Eq. 5). A second attention over
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
        combination: the form of Eq. 19: ``"log"`` (default, the softmax of the
            theta-weighted log-attentions, i.e. of the terms' logits) or
            ``"literal"`` (the softmax of the theta-weighted attentions, as printed,
            which is nearly uniform); see :func:`combine_attentions`.

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
        combination: str = "log",
        owner: str = "MAF",
    ) -> None:
        super().__init__()
        self.owner = owner  # the module named in error messages (HOCAFusion for the adapter)
        if combination not in EQ19_COMBINATIONS:
            raise ValueError(
                f"{owner}: combination must be one of {EQ19_COMBINATIONS} (HOCA Eq. 19), got "
                f"{combination!r}"
            )
        self.combination = combination
        self.input_dims = [int(dim) for dim in input_dims]
        count = len(self.input_dims)
        if count < 1 or query_dim <= 0 or out_dim <= 0 or attention_dim <= 0:
            raise ValueError(
                f"{owner}: sizes must be positive and at least one modality is needed, got "
                f"input_dims={self.input_dims}, query_dim={query_dim}, out_dim={out_dim}"
            )
        self.query_dim, self.out_dim, self.low_rank = int(query_dim), int(out_dim), bool(low_rank)
        self.subsets = parse_orders(orders, count)
        largest = max(len(subset) for subset in self.subsets)
        default = DEFAULT_LOW_RANK_MAX_LENGTH if low_rank else default_exact_max_length(largest)
        self.max_lengths = resolve_max_lengths(max_lengths, count, default, owner)
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
        sequences, full_masks = prepare_fusion_inputs(inputs, masks, self.input_dims, self.owner)
        if sequences[0].shape[0] == 0 and not return_details:
            return empty_output(self, sequences)  # B = 0
        if needs_float32(self, query, *sequences):  # float16: computed in float32
            return float32_call(self, (query, sequences, full_masks), {"return_details": return_details})
        check_query(query, sequences[0].shape[0], self.query_dim, self.owner)
        with inputs_checked():  # inputs checked once, here; the math below checks shapes only
            result = self.fuse_prepared(query, sequences, full_masks)
        return result if return_details else result.fused

    def fuse_prepared(
        self, query: Tensor, sequences: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> MAFOutput:
        """:meth:`forward` for inputs already validated, zero at padded steps, with bool masks."""
        check_query(query, sequences[0].shape[0], self.query_dim, self.owner)
        check_lengths(
            [sequences[i] for i in self._limited],
            [self.max_lengths[i] for i in self._limited],
            self.owner,
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
            attention = combine_attentions(
                stacked, self.order_weights[i], mask, self.combination
            )  # Eq. 19
            fused_attention.append(attention)
            contexts.append(weighted_sum(attention, x))  # Eq. 5
        query_part = self.fusion_query(query)  # W_e h_t + b_e, (B, fusion_dim)
        scores = torch.stack(
            [
                torch.tanh(query_part + projection(context)) @ self.fusion_score
                for projection, context in zip(self.fusion_contexts, contexts, strict=True)
            ],
            dim=1,
        )  # (B, n), e_t^k of Eq. 21
        modality_weights = widen_under_autocast(scores).softmax(dim=1)  # beta_t^k, Eq. 20 (float32 under autocast)
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
            f"subsets={self.subsets}, low_rank={self.low_rank}, max_lengths={self.max_lengths}, "
            f"combination={self.combination!r}"
        )


# ---------------------------------------------------------------------------
# Registry adapters
# ---------------------------------------------------------------------------


@register("maf")
class MAFFusion(FusionModule):
    """Multiple attentive fusion (:class:`MAF`) behind the common fusion interface.

    MAF attends to the modalities from a decoder state; a fusion module has no
    decoder, so its query is a pooled summary of the inputs (``query="pooled"``:
    tanh of a linear map of the masked means) or a learned vector
    (``query="learned"``). Every other option is :class:`MAF`'s: ``orders``
    (default ``"UBT"``), ``low_rank`` (Low-Rank HOCA terms of rank ``rank``
    instead of exact HOCA), ``max_lengths``, ``max_elements``, ``combination``.
    The registered ``hoca`` and ``lowrank_hoca`` are this module with exact and
    low-rank terms.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        orders: Orders = "UBT",
        low_rank: bool = False,
        rank: int = 1,
        attention_dim: int = 32,
        query: str = "pooled",
        query_dim: int | None = None,
        max_lengths: MaxLengths = None,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        combination: str = "log",
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
            self.input_dims, query_dim, out_dim, attention_dim=attention_dim, orders=orders,
            low_rank=low_rank, rank=rank, max_lengths=max_lengths, max_elements=max_elements,
            combination=combination, owner=type(self).__name__,
        )

    def make_query(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
        """The (B, d_q) query for validated inputs."""
        if self.query_mode == "learned":
            return self.learned_query.expand(inputs[0].shape[0], -1)
        pooled = torch.cat([masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)], dim=-1)
        return torch.tanh(self.query_projection(pooled))

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self.fuse_details(inputs, masks).fused

    def fuse_details(self, inputs: list[Tensor], masks: list[Tensor]) -> FusionOutput:
        """Fused output and MAF's per-modality attention (B, T_j) (HOCA Eq. 19)."""
        result = self.maf.fuse_prepared(self.make_query(inputs, masks), inputs, masks)
        return FusionOutput(result.fused, None, result.attention)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", query={self.query_mode!r}"


@register("hoca")
class HOCAFusion(MAFFusion):
    """Exact HOCA with multiple attentive fusion behind the common fusion interface.

    ``forward(inputs [(B, T_i, d_i)], masks) -> (B, out_dim)``: the query is a
    pooled summary of the inputs (``query="pooled"``, tanh of a linear map of the
    masked means) or a learned vector (``query="learned"``); :class:`MAF` with
    ``orders`` (default ``"UBT"``, the paper's HOCA-UBT) does the rest.
    ``max_lengths`` bounds each modality's length (default
    :func:`default_exact_max_length` of the largest order: 64 for up to four
    modalities); longer inputs are refused with a clear error. ``combination``
    picks the form of Eq. 19 (see :class:`MAF`).
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
        combination: str = "log",
    ) -> None:
        super().__init__(
            input_dims, out_dim, orders=orders, low_rank=False, attention_dim=attention_dim,
            query=query, query_dim=query_dim, max_lengths=max_lengths,
            max_elements=max_elements, combination=combination,
        )


@register("lowrank_hoca")
class LowRankHOCAFusion(MAFFusion):
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
        combination: str = "log",
    ) -> None:
        super().__init__(
            input_dims, out_dim, orders=orders, low_rank=True, rank=rank,
            attention_dim=attention_dim, query=query, query_dim=query_dim,
            max_lengths=max_lengths, combination=combination,
        )
