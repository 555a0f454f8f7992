"""Numerics shared by every fusion module: empty batches and float16.

:func:`guarded_fuse` wraps a module's ``fuse`` step:

- an empty batch (B = 0) returns an empty (0, out_dim) output, still connected
  to the inputs' graph, instead of failing in a reshape;
- float16 (inputs or weights) is computed in float32, as mixed-precision
  autocast does for reductions, softmax and products, and cast back. float16
  holds only |x| <= 65504: when the output or a gradient does not fit, a
  ValueError names the module and says to use bfloat16 or float32, instead of
  returning Inf / NaN silently. bfloat16 (float32's range) runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["FLOAT16_MAX", "guarded_fuse"]

FLOAT16_MAX = float(torch.finfo(torch.float16).max)


def _advice(owner: str, what: str) -> str:
    return (
        f"{owner}: {what} exceeds float16's range (|x| <= {FLOAT16_MAX:g}) for these inputs; "
        "run this module in bfloat16 or float32, or scale the inputs (or the loss) down"
    )


class _CheckedCast(torch.autograd.Function):
    """``x.to(dtype)`` whose backward refuses a gradient that overflows ``x``'s own dtype."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dtype: torch.dtype, owner: str) -> Tensor:
        ctx.source, ctx.owner = x.dtype, owner
        return x.to(dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cast = grad.to(ctx.source)
        if bool(torch.isfinite(grad).all()) and not bool(torch.isfinite(cast).all()):
            raise ValueError(_advice(ctx.owner, "a gradient"))
        return cast, None, None


def _checked_cast(x: Tensor, dtype: torch.dtype, owner: str) -> Tensor:
    if x.dtype == dtype or not x.is_floating_point():
        return x
    return _CheckedCast.apply(x, dtype, owner)


def _empty_output(module: nn.Module, sequences: Sequence[Tensor]) -> Tensor:
    """(0, out_dim), connected to the inputs and weights so that backward runs."""
    out = sequences[0].new_zeros((0, int(module.out_dim)))
    anchor = sum(x.sum() for x in sequences)
    for parameter in module.parameters():
        if parameter.requires_grad and parameter.is_floating_point():
            anchor = anchor + parameter.sum().to(out.dtype)
    return out + 0 * anchor


def guarded_fuse(
    module: nn.Module,
    fuse: Callable[[list[Tensor], list[Tensor]], Tensor],
    sequences: list[Tensor],
    masks: list[Tensor],
) -> Tensor:
    """``fuse(sequences, masks)`` -> (B, out_dim), safe for B = 0 and float16 (see module docstring).

    ``sequences``: validated (B, T_j, d_j) inputs; ``masks``: (B, T_j) bool.
    """
    if sequences[0].shape[0] == 0:
        return _empty_output(module, sequences)
    half = torch.float16
    if all(x.dtype != half for x in sequences) and all(p.dtype != half for p in module.parameters()):
        return fuse(sequences, masks)
    owner = type(module).__name__
    dtype = sequences[0].dtype
    state = {name: _checked_cast(p, torch.float32, owner) for name, p in module.named_parameters()}
    state.update({name: b.float() if b.is_floating_point() else b for name, b in module.named_buffers()})
    wide = [_checked_cast(x, torch.float32, owner) for x in sequences]
    result = torch.func.functional_call(module, state, (wide, masks), strict=False)
    if dtype == half:
        if bool(torch.isfinite(result).all()) and not bool(torch.isfinite(result.to(half)).all()):
            raise ValueError(_advice(owner, "the output"))
        return _checked_cast(result, half, owner)
    return result.to(dtype)
