"""Baseline fusion modules: late fusion by concatenation, TFN and LMF.

Legend for shapes: ``B`` batch, ``T_j`` length of modality j, ``d_j`` its feature
size, ``h_j`` the size of its vector after the modality subnetwork, ``m`` the
number of modalities, ``R`` the rank of LMF, ``O`` the output size (``out_dim``).

All three pool every modality over its real steps first (a masked mean), so they
see one vector per modality and sample; the pure functions
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

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from polyfuse.functional.pooling import masked_mean
from polyfuse.functional.tensor_fusion import low_rank_fusion, tensor_fusion
from polyfuse.nn.base import FusionModule
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


def _check_dropout(dropout: float, owner: str) -> float:
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{owner}: dropout must lie in [0, 1), got {dropout}")
    return float(dropout)


def _subnetworks(input_dims: Sequence[int], hidden_dims: Sequence[int]) -> nn.ModuleList:
    """One Linear + ReLU per modality: (B, d_j) -> (B, h_j)."""
    return nn.ModuleList(
        nn.Sequential(nn.Linear(d, h), nn.ReLU())
        for d, h in zip(input_dims, hidden_dims, strict=True)
    )


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
        self.dropout = _check_dropout(dropout, "Concat")
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

    Each modality is masked-mean pooled and passed through its subnetwork
    (Linear + ReLU) to z_j of size h_j; the fusion layer takes the outer product
    of the ``[z_j, 1]`` (:func:`tensor_fusion`, TFN's Tensor Fusion Layer), flattened to
    ``prod_j (h_j + 1)`` entries; dropout and a post-fusion MLP (Linear, ReLU,
    Linear) map it to the output.

    The fused size grows exponentially with m, so construction refuses a size
    above ``max_fused_size`` rather than exhausting memory at the first batch.

    Args:
        input_dims: feature size d_j of each modality (m >= 2).
        out_dim: output size O.
        hidden_dims: h_j, the subnetwork output size: one int for all modalities
            or one per modality.
        post_fusion_dim: width of the post-fusion MLP's hidden layer.
        dropout: dropout probability on the fused tensor.
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
        hidden_dims: int | Sequence[int] = 16,
        post_fusion_dim: int = 64,
        dropout: float = 0.0,
        max_fused_size: int = 2**20,
    ) -> None:
        super().__init__(input_dims, out_dim)
        self.hidden_dims = _per_modality(hidden_dims, self.num_modalities, "hidden_dims", "TFN")
        if post_fusion_dim <= 0:
            raise ValueError(f"TFN: post_fusion_dim must be positive, got {post_fusion_dim}")
        self.dropout = _check_dropout(dropout, "TFN")
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
        self.post_fusion_dim = int(post_fusion_dim)
        self.max_fused_size = int(max_fused_size)
        self.subnetworks = _subnetworks(self.input_dims, self.hidden_dims)
        self.post_fusion = nn.Sequential(
            nn.Dropout(self.dropout),
            nn.Linear(self.fused_size, self.post_fusion_dim),
            nn.ReLU(),
            nn.Linear(self.post_fusion_dim, self.out_dim),
        )

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        vectors = [
            subnetwork(masked_mean(x, mask))  # (B, h_j)
            for subnetwork, x, mask in zip(self.subnetworks, inputs, masks, strict=True)
        ]
        return self.post_fusion(tensor_fusion(vectors))  # (B, prod_j (h_j + 1)) -> (B, O)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, hidden_dims={self.hidden_dims}, "
            f"fused_size={self.fused_size}, post_fusion_dim={self.post_fusion_dim}, "
            f"dropout={self.dropout}"
        )


@register("lmf")
class LMF(FusionModule):
    """Low-rank Multimodal Fusion (Liu et al., ACL 2018).

    Each modality is masked-mean pooled to a vector z_j (optionally through a
    Linear + ReLU subnetwork of size h_j; without one, h_j = d_j); the output is
    ``h = sum_r w_r * prod_j ([z_j, 1] W_j^{(r)}) + b`` (:func:`low_rank_fusion`), the tensor fusion of TFN with its weight tensor constrained to
    rank R, computed in O(R * O * sum_j h_j) instead of O(O * prod_j h_j).

    Args:
        input_dims: feature size d_j of each modality (m >= 2).
        out_dim: output size O.
        rank: R, the number of rank-1 terms.
        hidden_dims: None (fuse the pooled inputs directly), or h_j: one int for
            all modalities or one per modality, the size of a Linear + ReLU
            subnetwork applied after pooling.

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
        hidden_dims: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__(input_dims, out_dim)
        if rank <= 0:
            raise ValueError(f"LMF: rank must be positive, got {rank}")
        self.rank = int(rank)
        if hidden_dims is None:
            self.hidden_dims = list(self.input_dims)
            self.subnetworks = None
        else:
            self.hidden_dims = _per_modality(
                hidden_dims, self.num_modalities, "hidden_dims", "LMF"
            )
            self.subnetworks = _subnetworks(self.input_dims, self.hidden_dims)
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
        vectors = [masked_mean(x, mask) for x, mask in zip(inputs, masks, strict=True)]
        if self.subnetworks is not None:
            vectors = [net(v) for net, v in zip(self.subnetworks, vectors, strict=True)]
        return low_rank_fusion(vectors, list(self.factors), self.rank_weights, bias=self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, hidden_dims={self.hidden_dims}"
