"""Fusion of pooled modality vectors: tensor fusion (TFN; Zadeh et al., EMNLP 2017)
and its low-rank factorisation (LMF; Liu et al., ACL 2018).

Shapes: ``B`` batch, ``h_j`` size of modality j's vector, ``R`` rank, ``O`` output size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["append_one", "low_rank_fusion", "tensor_fusion"]




def append_one(vector: Tensor) -> Tensor:
    """``[z, 1]``: (B, h) -> (B, h + 1), the constant that keeps lower-order terms."""
    return F.pad(vector, (0, 1), value=1.0)


def tensor_fusion(vectors: Sequence[Tensor]) -> Tensor:
    """The TFN fusion layer: outer product of the ``[z_j, 1]`` vectors, flattened.

    Args:
        vectors: m >= 1 tensors z_j of shape (B, h_j).

    Returns:
        (B, prod_j (h_j + 1)): entry ``(i_1, ..., i_m)`` in row-major order is
        ``prod_j [z_j, 1][i_j]`` (TFN's Tensor Fusion Layer, generalised from three
        modalities to m). Because every vector ends with a 1, the result holds every unimodal,
        bimodal, ..., m-modal product of features.
    """
    if len(vectors) == 0:
        raise ValueError("tensor_fusion needs at least one vector")
    fused = append_one(vectors[0])
    for vector in vectors[1:]:
        # batched outer product, then flatten (B, P, h + 1) -> (B, P * (h + 1))
        fused = (fused.unsqueeze(2) * append_one(vector).unsqueeze(1)).flatten(start_dim=1)
    return fused


def low_rank_fusion(
    vectors: Sequence[Tensor],
    factors: Sequence[Tensor],
    rank_weights: Tensor,
    *,
    bias: Tensor | None = None,
) -> Tensor:
    """The LMF fusion layer: a rank-R tensor fusion computed without the outer product.

    Args:
        vectors: m tensors z_j of shape (B, h_j).
        factors: m modality-specific factors W_j of shape (R, h_j + 1, O).
        rank_weights: (R,) fusion weights w_r over the rank-1 terms.
        bias: (O,) or None.

    Returns:
        (B, O): ``h = sum_r w_r * prod_j ([z_j, 1] W_j^{(r)}) + b``: LMF's fusion with
        modality-specific factors, including its fusion weights over ranks and bias. This equals
        the full tensor fusion ``W · tensor_fusion(vectors) + b`` with the weight
        tensor ``W = sum_r w_r outer_j W_j^{(r)}`` of shape (h_1 + 1, ..., h_m + 1, O).
    """
    if len(vectors) != len(factors):
        raise ValueError(
            f"low_rank_fusion: {len(vectors)} vectors but {len(factors)} factors"
        )
    product = None
    for j, (vector, factor) in enumerate(zip(vectors, factors, strict=True)):
        if factor.dim() != 3 or factor.shape[1] != vector.shape[-1] + 1:
            raise ValueError(
                f"low_rank_fusion: factor {j} has shape {tuple(factor.shape)}, expected "
                f"(rank, {vector.shape[-1] + 1}, out_dim) for a vector of size {vector.shape[-1]}"
            )
        # [z_j, 1] W_j^{(r)} = z_j W_j^{(r)}[:h_j] + W_j^{(r)}[h_j], all ranks in one batched
        # product on views of the factor (no copy of it, no padded copy of z_j).
        rank = factor.shape[0]
        projected = torch.baddbmm(
            factor[:, -1:], vector.unsqueeze(0).expand(rank, -1, -1), factor[:, :-1]
        )  # (R, B, O)
        product = projected if product is None else product * projected
    rank, batch, out_dim = product.shape
    fused = (rank_weights @ product.reshape(rank, batch * out_dim)).view(batch, out_dim)  # sum_r w_r
    return fused if bias is None else fused + bias
