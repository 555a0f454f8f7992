"""MulT's Transformer encoder, used both crossmodally and as self-attention.

Following MulT (Tsai et al., ACL 2019, Section 3.2 and its public code): inputs
are scaled by sqrt(D) and given sinusoidal positions, then embedding dropout;
each layer is pre-LayerNorm multi-head attention (queries from the target, keys
and values from the source, the same LayerNorm on both) with residual dropout
and a residual connection, then a pre-LayerNorm position-wise feed-forward
network D -> 4D -> D (ReLU) with its own residual; a final LayerNorm closes the
stack. Without a source the layer is self-attention.

Shapes: ``B`` batch, ``T_q`` target steps, ``T_k`` source steps, ``D`` model size.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from polyfuse.functional.crossmodal import multihead_attention, sinusoidal_positions

__all__ = ["CrossmodalAttention", "CrossmodalEncoder", "CrossmodalLayer"]


class CrossmodalAttention(nn.Module):
    """Projections around :func:`multihead_attention`: Q = X_q W_Q, K = X_k W_K,
    V = X_k W_V (with biases), heads concatenated, then W_O (MulT Eq. 1 / 3)."""

    def __init__(self, dim: int, heads: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"CrossmodalAttention: dim={dim} is not divisible by heads={heads}")
        self.heads, self.dropout = int(heads), float(dropout)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, dim)

    def forward(self, target: Tensor, source: Tensor, source_mask: Tensor | None = None) -> Tensor:
        """(B, T_q, D), (B, T_k, D), (B, T_k) -> (B, T_q, D)."""
        attended = multihead_attention(
            self.query(target), self.key(source), self.value(source), heads=self.heads,
            key_mask=source_mask, dropout=self.dropout, training=self.training,
        )
        return self.output(attended)


class CrossmodalLayer(nn.Module):
    """One pre-LayerNorm layer: attention block and feed-forward block, each residual."""

    def __init__(self, dim: int, heads: int, *, attention_dropout: float = 0.1, relu_dropout: float = 0.1,
                 residual_dropout: float = 0.1) -> None:
        super().__init__()
        self.attention = CrossmodalAttention(dim, heads, dropout=attention_dropout)
        self.attention_norm = nn.LayerNorm(dim)
        self.feedforward_norm = nn.LayerNorm(dim)
        self.expand = nn.Linear(dim, 4 * dim)
        self.contract = nn.Linear(4 * dim, dim)
        self.relu_dropout, self.residual_dropout = float(relu_dropout), float(residual_dropout)

    def forward(self, target: Tensor, source: Tensor | None, source_mask: Tensor) -> Tensor:
        normed = self.attention_norm(target)
        keys = normed if source is None else self.attention_norm(source)
        attended = self.attention(normed, keys, source_mask)
        target = target + F.dropout(attended, self.residual_dropout, self.training)
        hidden = F.dropout(F.relu(self.expand(self.feedforward_norm(target))), self.relu_dropout, self.training)
        return target + F.dropout(self.contract(hidden), self.residual_dropout, self.training)


class CrossmodalEncoder(nn.Module):
    """A stack of :class:`CrossmodalLayer` (see the module docstring).

    ``forward(target, target_mask, source=None, source_mask=None)``: (B, T_q, D)
    -> (B, T_q, D); padded target steps come out zero. Without ``source`` the
    stack attends over the target itself (MulT's self-attention memory).
    """

    def __init__(self, dim: int, heads: int, layers: int, *, attention_dropout: float = 0.1,
                 relu_dropout: float = 0.1, residual_dropout: float = 0.1, embed_dropout: float = 0.25) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"CrossmodalEncoder: layers must be >= 1, got {layers}")
        self.dim, self.embed_dropout = int(dim), float(embed_dropout)
        self.layers = nn.ModuleList(
            CrossmodalLayer(dim, heads, attention_dropout=attention_dropout, relu_dropout=relu_dropout,
                            residual_dropout=residual_dropout)
            for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(dim)

    def _embed(self, x: Tensor, mask: Tensor) -> Tensor:
        positions = sinusoidal_positions(x.shape[1], self.dim, dtype=x.dtype, device=x.device)
        embedded = (math.sqrt(self.dim) * x + positions) * mask.unsqueeze(-1)
        return F.dropout(embedded, self.embed_dropout, self.training)

    def forward(self, target: Tensor, target_mask: Tensor, source: Tensor | None = None,
                source_mask: Tensor | None = None) -> Tensor:
        x = self._embed(target, target_mask)
        if source is None:
            keys, key_mask = None, target_mask
        else:
            if source_mask is None:
                raise ValueError("CrossmodalEncoder: a source needs its mask")
            keys, key_mask = self._embed(source, source_mask), source_mask
        for layer in self.layers:
            x = layer(x, keys, key_mask)
        return self.final_norm(x) * target_mask.unsqueeze(-1)
