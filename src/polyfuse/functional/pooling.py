"""Pooling over the time axis that respects padding masks."""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse._precision import float32_under_autocast

__all__ = ["masked_mean", "masked_softmax"]


@float32_under_autocast
def masked_softmax(logits: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis of ``logits`` (..., T) restricted to ``mask`` (..., T)
    (True = a real step): padded steps get probability 0. Under ``torch.autocast`` the
    softmax (its exponentials and denominator) computes in float32 and returns float32."""
    return logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over its real steps.

    Args:
        x: (..., T, d) sequence.
        mask: (..., T) bool, True at real steps.

    Returns:
        (..., d): the sum of ``x`` over the steps where ``mask`` is True, divided by
        their count. Padded steps contribute nothing whatever they hold (even NaN);
        a sample without any real step gets a zero vector.
    """
    if x.shape[-2] == 1:  # a vector given as a sequence of length 1: no division
        return torch.where(mask, x.squeeze(-2), 0.0)
    weights = mask.to(x.dtype).unsqueeze(-1)  # (..., T, 1)
    total = torch.where(mask.unsqueeze(-1), x, torch.zeros_like(x)).sum(dim=-2)  # (..., d)
    count = weights.sum(dim=-2).clamp_min(1.0)  # (..., 1)
    return total / count
