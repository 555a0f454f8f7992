"""Crossmodal attention of the Multimodal Transformer (MulT; Tsai et al., ACL 2019).

MulT's crossmodal attention from a source modality beta to a target modality
alpha (MulT Eq. 1 / 3) is scaled dot-product attention whose queries come from
alpha and whose keys and values come from beta:

    CM_{beta -> alpha}(X_alpha, X_beta) = softmax(Q_alpha K_beta^T / sqrt(d_k)) V_beta,

computed per head and concatenated. Positions follow MulT's sinusoidal
embedding (the fairseq layout: sines in the first half of the features,
cosines in the second, positions counted from 1).

Shapes: ``B`` batch, ``T_q`` target (query) steps, ``T_k`` source steps,
``D`` model size, ``H`` heads, ``D / H`` the size of one head.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor

from polyfuse._precision import widen_under_autocast

__all__ = ["multihead_attention", "sinusoidal_positions"]


def sinusoidal_positions(length: int, dim: int, *, dtype: torch.dtype = torch.float32,
                         device: torch.device | None = None) -> Tensor:
    """(length, dim) sinusoidal position embeddings of positions 1..length.

    Row p (position p + 1) is ``[sin((p+1) w_0), ..., sin((p+1) w_{h-1}),
    cos((p+1) w_0), ..., cos((p+1) w_{h-1})]`` with ``h = dim // 2`` and
    ``w_i = 10000^(-i / (h - 1))``; an odd ``dim`` ends with a zero column.
    """
    if length < 0 or dim < 2:
        raise ValueError(f"sinusoidal_positions: need length >= 0 and dim >= 2, got {length}, {dim}")
    half = dim // 2
    step = math.log(10000.0) / max(half - 1, 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64, device=device) * -step)  # (h,)
    positions = torch.arange(1, length + 1, dtype=torch.float64, device=device)  # (length,)
    angles = positions[:, None] * frequencies[None, :]  # (length, h)
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(length, 1, dtype=table.dtype, device=device)], dim=1)
    return table.to(dtype)


def multihead_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    heads: int,
    key_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Multi-head scaled dot-product attention of projected queries over keys (MulT Eq. 1).

    Args:
        query: (B, T_q, D) projected queries Q (target modality).
        key: (B, T_k, D) projected keys K (source modality).
        value: (B, T_k, D) projected values V (source modality).
        heads: H; D must be divisible by H.
        key_mask: (B, T_k) bool, True at real source steps, or None (all real).
        dropout: dropout on the attention weights (training only).
        training: whether dropout applies.

    Returns:
        (B, T_q, D): per head ``softmax(Q_h K_h^T / sqrt(D / H)) V_h`` over the real
        source steps, heads concatenated. A sample whose source has no real step
        (a missing modality) attends to nothing: its rows are zero, not NaN.
    """
    if query.dim() != 3 or key.dim() != 3 or value.shape != key.shape:
        raise ValueError(
            f"multihead_attention: expected query (B, T_q, D) and key / value (B, T_k, D), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    dim = query.shape[-1]
    if key.shape[-1] != dim or key.shape[0] != query.shape[0]:
        raise ValueError(
            f"multihead_attention: query {tuple(query.shape)} and key {tuple(key.shape)} disagree in B or D"
        )
    if heads < 1 or dim % heads:
        raise ValueError(f"multihead_attention: model size {dim} is not divisible by heads={heads}")
    q = rearrange(query, "b q (h e) -> b h q e", h=heads)
    k = rearrange(key, "b k (h e) -> b h k e", h=heads)
    v = rearrange(value, "b k (h e) -> b h k e", h=heads)
    # Under autocast the softmax (exponentials, denominator) computes in float32.
    logits = widen_under_autocast(torch.einsum("bhqe,bhke->bhqk", q, k)) / math.sqrt(dim // heads)
    if key_mask is not None:
        if key_mask.shape != key.shape[:2] or key_mask.dtype != torch.bool:
            raise ValueError(
                f"multihead_attention: key_mask must be bool of shape {tuple(key.shape[:2])}, "
                f"got {key_mask.dtype} {tuple(key_mask.shape)}"
            )
        allowed = key_mask[:, None, None, :]  # (B, 1, 1, T_k)
        present = allowed.any(dim=-1, keepdim=True)  # (B, 1, 1, 1): the source has a real step
        # Rows without any real key get finite logits (no NaN, not even in gradients) and weight 0.
        logits = logits.masked_fill(~allowed & present, float("-inf")).masked_fill(~present, 0.0)
        weights = logits.softmax(dim=-1) * present
    else:
        weights = logits.softmax(dim=-1)
    if dropout and training:
        weights = torch.nn.functional.dropout(weights, p=dropout, training=True)
    attended = torch.einsum("bhqk,bhke->bhqe", weights, v)
    return rearrange(attended, "b h q e -> b q (h e)")
