"""Baseline fusion modules: late fusion by concatenation, TFN and LMF.

Legend for shapes: ``B`` batch, ``T_j`` length of modality j, ``d_j`` its feature
size, ``h_j`` the size of its vector after the modality subnetwork, ``m`` the
number of modalities, ``R`` the rank of LMF, ``O`` the output size (``out_dim``).

Concat pools every modality over its real steps (a masked mean); TFN and LMF map
every modality to one vector with their papers' modality subnetworks
(:mod:`polyfuse.nn.modality_subnetworks`: an LSTM for the text-like modalities, a
masked mean and a few Linear + ReLU layers for the others), or with a lighter form
on request (``subnetworks="light"``). The pure functions
:func:`polyfuse.functional.masked_mean`, :func:`polyfuse.functional.tensor_fusion` and
:func:`polyfuse.functional.low_rank_fusion` hold the math and the modules own the
parameters.

References:
    TFN: A. Zadeh, M. Chen, S. Poria, E. Cambria, L.-P. Morency. "Tensor Fusion
    Network for Multimodal Sentiment Analysis." EMNLP 2017.
    LMF: Z. Liu, Y. Shen, V. B. Lakshminarasimhan, P. P. Liang, A. Zadeh,
    L.-P. Morency. "Efficient Low-rank Multimodal Fusion with Modality-Specific
    Factors." ACL 2018.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from polyfuse._checks import check_dropout
from polyfuse.functional.pooling import masked_mean
from polyfuse.functional.tensor_fusion import low_rank_fusion, tensor_fusion
from polyfuse.nn.base import FusionModule
from polyfuse.nn.modality_subnetworks import (
    PooledSubnetwork,
    SequenceSubnetwork,
    encode,
    lstm_outputs,
)
from polyfuse.nn.registry import register

__all__ = ["LMF", "TFN", "Concat"]


# ---------------------------------------------------------------------------
# Helpers for the modules
# ---------------------------------------------------------------------------


def _per_modality(value: int | Sequence[int], count: int, what: str, owner: str) -> list[int]:
    """One positive int per modality from an int (shared) or a sequence of m ints."""
    sizes = [int(value)] * count if isinstance(value, int) else [int(v) for v in value]
    if len(sizes) != count:
        raise ValueError(f"{owner}: {what} has {len(sizes)} entries for {count} modalities")
    if any(size <= 0 for size in sizes):
        raise ValueError(f"{owner}: {what} must be positive, got {sizes}")
    return sizes


@dataclass(frozen=True)
class _Subnetworks:
    """The modality subnetworks of one model in one form (see :func:`_build_subnetworks`)."""

    sequence_modalities: tuple[int, ...]  # the modalities read by an LSTM
    lstm_dim: int  # H, the LSTM's hidden size
    sequence_hidden: int  # default h_j of a modality read by an LSTM
    pooled_hidden: int  # default h_j of a pooled modality
    pooled_layers: int  # Linear + ReLU layers after the mean
    sequence_layers: int  # Linear layers after the LSTM
    sequence_activation: bool  # a ReLU after each of them


SUBNETWORK_FORMS = ("paper", "light")

# TFN section 3.1: text through an LSTM of 128 units and two layers of 128 ReLU units;
# audio and video averaged over time, then three hidden layers of 32 ReLU units.
_TFN_PAPER = _Subnetworks((0,), 128, 128, 32, 3, 2, True)
# LMF: an LSTM then a linear layer for text (thid = 128 and text_out = thid / 2 in the
# authors' MOSI search), a 2-layer network for audio and video (widths 4, 8 or 16 there).
_LMF_PAPER = _Subnetworks((0,), 128, 64, 16, 2, 1, False)
# polyfuse's earlier form: the mean and one Linear + ReLU for every modality.
_LIGHT = _Subnetworks((), 128, 16, 16, 1, 1, True)


def _build_subnetworks(
    owner: str,
    input_dims: Sequence[int],
    form: _Subnetworks,
    sequence_modalities: Sequence[int] | None,
    hidden_dims: int | Sequence[int] | None,
    lstm_dim: int | None,
    dropout: float,
) -> nn.ModuleList:
    """One subnetwork per modality: a :class:`SequenceSubnetwork` for the indices in
    ``sequence_modalities`` (None: the form's), a :class:`PooledSubnetwork` for the
    others; None sizes come from the form. (B, T_j, d_j), (B, T_j) -> (B, h_j)."""
    count = len(input_dims)
    sequence = form.sequence_modalities if sequence_modalities is None else tuple(sequence_modalities)
    if any(not isinstance(j, int) or isinstance(j, bool) for j in sequence):
        raise ValueError(f"{owner}: sequence_modalities must be modality indices, got {list(sequence)}")
    if len(set(sequence)) != len(sequence) or any(not 0 <= j < count for j in sequence):
        raise ValueError(
            f"{owner}: sequence_modalities must be distinct indices in [0, {count}), got {list(sequence)}"
        )
    if hidden_dims is None:
        hidden_dims = [form.sequence_hidden if j in sequence else form.pooled_hidden for j in range(count)]
    hidden = _per_modality(hidden_dims, count, "hidden_dims", owner)
    lstm_dim = form.lstm_dim if lstm_dim is None else int(lstm_dim)
    if lstm_dim <= 0:
        raise ValueError(f"{owner}: lstm_dim must be positive, got {lstm_dim}")
    return nn.ModuleList(
        SequenceSubnetwork(
            d, lstm_dim, h, layers=form.sequence_layers,
            activation=form.sequence_activation, dropout=dropout,
        )
        if j in sequence
        else PooledSubnetwork(d, h, layers=form.pooled_layers, dropout=dropout)
        for j, (d, h) in enumerate(zip(input_dims, hidden, strict=True))
    )


def _form(subnetworks: str, owner: str, paper: _Subnetworks, light: _Subnetworks) -> _Subnetworks:
    if subnetworks not in SUBNETWORK_FORMS:
        raise ValueError(
            f"{owner}: subnetworks must be one of {', '.join(SUBNETWORK_FORMS)}, got {subnetworks!r}"
        )
    return paper if subnetworks == "paper" else light




# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


@register("concat")
class Concat(FusionModule):
    """Late fusion: masked-mean pool each modality, concatenate, then an MLP.

    The simplest baseline of the multimodal sentiment literature (the early/late
    fusion baselines compared against in TFN, Zadeh et al., EMNLP 2017): no
    interaction between modalities beyond what the MLP learns from the
    concatenated vector.

    Args:
        input_dims: feature size d_j of each modality (m >= 2).
        out_dim: output size O.
        hidden_dim: width of the MLP's hidden layer.
        dropout: dropout probability after the hidden layer.

    Shapes:
        inputs: m tensors (B, T_j, d_j) or (B, d_j); masks: (B, T_j) bool or None.
        Output: (B, O).
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        hidden_dim: int = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_dims, out_dim)
        if hidden_dim <= 0:
            raise ValueError(f"Concat: hidden_dim must be positive, got {hidden_dim}")
        self.hidden_dim = int(hidden_dim)
        self.dropout = check_dropout(dropout, "Concat")
        self.mlp = nn.Sequential(
            nn.Linear(sum(self.input_dims), self.hidden_dim),
            nn.ReLU(),
            nn.Dropout(self.dropout),
            nn.Linear(self.hidden_dim, self.out_dim),
        )

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        pooled = [masked_mean(x, mask) for x, mask in zip(inputs, masks, strict=True)]
        return self.mlp(torch.cat(pooled, dim=-1))  # (B, sum_j d_j) -> (B, O)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hidden_dim={self.hidden_dim}, dropout={self.dropout}"


@register("tfn")
class TFN(FusionModule):
    """Tensor Fusion Network (Zadeh et al., EMNLP 2017), for any number of modalities.

    Three parts, as in the paper (section 3):

    1. Modality embedding subnetworks map each modality to z_j of size h_j. With
       ``subnetworks="paper"`` (the default): the modalities in
       ``sequence_modalities`` (default ``(0,)``: the first modality plays the
       paper's spoken language) go through an LSTM of ``lstm_dim`` units and two
       Linear + ReLU layers of width h_j (paper: 128); every other modality is
       averaged over its real steps and goes through three Linear + ReLU layers of
       width h_j (paper: 32 for audio and video). With ``subnetworks="light"``:
       every modality is averaged and goes through one Linear + ReLU (h_j = 16),
       polyfuse's earlier form.
    2. The Tensor Fusion Layer: the outer product of the ``[z_j, 1]``
       (:func:`tensor_fusion`), flattened to ``prod_j (h_j + 1)`` entries.
    3. The sentiment inference subnetwork: dropout, ``post_fusion_layers``
       Linear + ReLU layers of width ``post_fusion_dim`` (paper: two layers of 128),
       then a Linear layer to the output. The light form has one layer of 64.

    The fused size grows exponentially with m, so construction refuses a size
    above ``max_fused_size`` rather than exhausting memory at the first batch.

    Args:
        input_dims: feature size d_j of each modality (m >= 2).
        out_dim: output size O.
        subnetworks: ``"paper"`` or ``"light"``: the form of the subnetworks and the
            defaults of the sizes below.
        sequence_modalities: indices of the modalities read by an LSTM (None: the
            form's, ``(0,)`` for the paper, none for light).
        hidden_dims: h_j: one int for all modalities or one per modality (None: the form's).
        lstm_dim: hidden size of the LSTMs (None: 128).
        post_fusion_dim: width of the post-fusion layers (None: the form's).
        post_fusion_layers: number of post-fusion Linear + ReLU layers before the
            output layer (None: the form's).
        dropout: dropout probability on the fused tensor.
        subnetwork_dropout: dropout probability on each subnetwork's pooled vector
            or LSTM state.
        max_fused_size: the largest allowed ``prod_j (h_j + 1)`` (entries per sample).

    Shapes:
        inputs: m tensors (B, T_j, d_j) or (B, d_j); masks: (B, T_j) bool or None.
        Fused tensor: (B, prod_j (h_j + 1)). Output: (B, O).
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        subnetworks: str = "paper",
        sequence_modalities: Sequence[int] | None = None,
        hidden_dims: int | Sequence[int] | None = None,
        lstm_dim: int | None = None,
        post_fusion_dim: int | None = None,
        post_fusion_layers: int | None = None,
        dropout: float = 0.0,
        subnetwork_dropout: float = 0.0,
        max_fused_size: int = 2**20,
    ) -> None:
        super().__init__(input_dims, out_dim)
        form = _form(subnetworks, "TFN", _TFN_PAPER, _LIGHT)
        paper = subnetworks == "paper"
        post_fusion_dim = (128 if paper else 64) if post_fusion_dim is None else int(post_fusion_dim)
        post_fusion_layers = (2 if paper else 1) if post_fusion_layers is None else int(post_fusion_layers)
        if post_fusion_dim <= 0:
            raise ValueError(f"TFN: post_fusion_dim must be positive, got {post_fusion_dim}")
        if post_fusion_layers < 0:
            raise ValueError(f"TFN: post_fusion_layers must be >= 0, got {post_fusion_layers}")
        self.dropout = check_dropout(dropout, "TFN")
        self.subnetwork_dropout = check_dropout(subnetwork_dropout, "TFN", "subnetwork_dropout")
        self.form = subnetworks
        self.subnetworks = _build_subnetworks(
            "TFN", self.input_dims, form, sequence_modalities, hidden_dims, lstm_dim,
            self.subnetwork_dropout,
        )
        self.sequence_modalities = [
            j for j, net in enumerate(self.subnetworks) if isinstance(net, SequenceSubnetwork)
        ]
        self.hidden_dims = [net.output_dim for net in self.subnetworks]
        self.fused_size = math.prod(h + 1 for h in self.hidden_dims)
        if self.fused_size > max_fused_size:
            factors = " * ".join(str(h + 1) for h in self.hidden_dims)
            raise ValueError(
                f"TFN: the fused outer product would have prod_j (h_j + 1) = {factors} = "
                f"{self.fused_size:,} entries per sample, above max_fused_size = "
                f"{max_fused_size:,} (and the post-fusion layer alone would hold "
                f"{self.fused_size * post_fusion_dim:,} weights). Use smaller hidden_dims "
                f"(currently {self.hidden_dims}), fewer modalities or LMF, or raise the "
                f"limit with TFN(..., max_fused_size={self.fused_size})."
            )
        self.post_fusion_dim = post_fusion_dim
        self.post_fusion_layers = post_fusion_layers
        self.max_fused_size = int(max_fused_size)
        widths = [self.fused_size] + [post_fusion_dim] * post_fusion_layers
        layers: list[nn.Module] = [nn.Dropout(self.dropout)]
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], self.out_dim))
        self.post_fusion = nn.Sequential(*layers)

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        # The LSTMs (if any) first, in one eager call made here: under torch.compile the
        # rest is one graph (a call from a helper would cut one more frame).
        outputs = lstm_outputs(self.subnetworks, inputs, masks) if self.sequence_modalities else [None] * len(inputs)
        vectors = encode(self.subnetworks, inputs, masks, outputs)  # m x (B, h_j)
        return self.post_fusion(tensor_fusion(vectors))  # (B, prod_j (h_j + 1)) -> (B, O)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, subnetworks={self.form!r}, "
            f"sequence_modalities={self.sequence_modalities}, hidden_dims={self.hidden_dims}, "
            f"fused_size={self.fused_size}, post_fusion_dim={self.post_fusion_dim}, "
            f"post_fusion_layers={self.post_fusion_layers}, dropout={self.dropout}"
        )


@register("lmf")
class LMF(FusionModule):
    """Low-rank Multimodal Fusion (Liu et al., ACL 2018).

    Each modality goes through its subnetwork to z_j of size h_j. With
    ``subnetworks="paper"`` (the default): the modalities in ``sequence_modalities``
    (default ``(0,)``: the first modality plays the paper's text) go through an LSTM
    of ``lstm_dim`` units and one Linear layer to h_j (default 64); every other
    modality is averaged over its real steps and goes through a 2-layer Linear + ReLU
    network of width h_j (default 16). With ``subnetworks="light"``: every modality
    is averaged, then one Linear + ReLU of width h_j when ``hidden_dims`` is given,
    nothing otherwise (h_j = d_j), polyfuse's earlier form.

    The output is LMF's fusion with modality-specific factors,
    ``h = sum_r w_r * prod_j ([z_j, 1] W_j^{(r)}) + b`` (:func:`low_rank_fusion`):
    the tensor fusion of TFN with its weight tensor constrained to rank R, computed
    in O(R * O * sum_j h_j) instead of O(O * prod_j h_j). As in the paper, the fused
    vector is the model's output; there is no post-fusion network.

    Args:
        input_dims: feature size d_j of each modality (m >= 2).
        out_dim: output size O.
        rank: R, the number of rank-1 terms.
        subnetworks: ``"paper"`` or ``"light"``.
        sequence_modalities: indices of the modalities read by an LSTM (None: the
            form's, ``(0,)`` for the paper, none for light).
        hidden_dims: h_j: one int for all modalities or one per modality (None: the form's).
        lstm_dim: hidden size of the LSTMs (None: 128).
        subnetwork_dropout: dropout probability on each subnetwork's pooled vector
            or LSTM state.

    Parameters:
        factors[j]: (R, h_j + 1, O), the modality-specific factors W_j.
        rank_weights: (R,), the fusion weights w_r.
        bias: (O,).

    Shapes:
        inputs: m tensors (B, T_j, d_j) or (B, d_j); masks: (B, T_j) bool or None.
        Output: (B, O).
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        rank: int = 4,
        subnetworks: str = "paper",
        sequence_modalities: Sequence[int] | None = None,
        hidden_dims: int | Sequence[int] | None = None,
        lstm_dim: int | None = None,
        subnetwork_dropout: float = 0.0,
    ) -> None:
        super().__init__(input_dims, out_dim)
        if rank <= 0:
            raise ValueError(f"LMF: rank must be positive, got {rank}")
        self.rank = int(rank)
        form = _form(subnetworks, "LMF", _LMF_PAPER, _LIGHT)
        if subnetworks == "light" and hidden_dims is None:
            form = replace(form, pooled_layers=0)  # the pooled inputs themselves: h_j = d_j
        self.form = subnetworks
        self.subnetwork_dropout = check_dropout(subnetwork_dropout, "LMF", "subnetwork_dropout")
        self.subnetworks = _build_subnetworks(
            "LMF", self.input_dims, form, sequence_modalities, hidden_dims, lstm_dim,
            self.subnetwork_dropout,
        )
        self.sequence_modalities = [
            j for j, net in enumerate(self.subnetworks) if isinstance(net, SequenceSubnetwork)
        ]
        self.hidden_dims = [net.output_dim for net in self.subnetworks]
        self.factors = nn.ParameterList(
            nn.Parameter(torch.empty(self.rank, h + 1, self.out_dim)) for h in self.hidden_dims
        )
        self.rank_weights = nn.Parameter(torch.empty(self.rank))
        self.bias = nn.Parameter(torch.empty(self.out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal factors (per rank slice) and fusion weights, zero bias."""
        for h, factor in zip(self.hidden_dims, self.factors, strict=True):
            nn.init.normal_(factor, std=math.sqrt(2.0 / (h + 1 + self.out_dim)))
        nn.init.normal_(self.rank_weights, std=math.sqrt(2.0 / (1 + self.rank)))
        nn.init.zeros_(self.bias)

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        # The LSTMs (if any) first, in one eager call made here: under torch.compile the
        # rest is one graph (a call from a helper would cut one more frame).
        outputs = lstm_outputs(self.subnetworks, inputs, masks) if self.sequence_modalities else [None] * len(inputs)
        vectors = encode(self.subnetworks, inputs, masks, outputs)  # m x (B, h_j)
        return low_rank_fusion(vectors, list(self.factors), self.rank_weights, bias=self.bias)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rank={self.rank}, subnetworks={self.form!r}, "
            f"sequence_modalities={self.sequence_modalities}, hidden_dims={self.hidden_dims}"
        )
