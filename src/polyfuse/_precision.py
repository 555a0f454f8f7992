"""Numerics shared by every fusion module: empty batches, float16 and autocast.

:func:`guarded_fuse` wraps a module's ``fuse`` step:

- an empty batch (B = 0) returns an empty (0, out_dim) output, still connected
  to the inputs' graph, instead of failing in a reshape;
- float16 (inputs or weights) is computed in float32, as mixed-precision
  autocast does for reductions, softmax and products, and cast back. float16
  holds only |x| <= 65504: when the output or a gradient does not fit, a
  ValueError names the module and says to use bfloat16 or float32, instead of
  returning Inf / NaN silently. bfloat16 (float32's range) runs as it is.

Under ``torch.autocast`` (bfloat16 on CPU and CUDA, float16 on CUDA) matrix products
run in the low dtype, and on CPU even softmax, log-softmax, logsumexp, exp and norms
of a low-precision tensor stay in it. :func:`float32_under_autocast` marks the
numerically sensitive pure functions (exponentials and their stabilisers, softmax
denominators and normalisers, Lorentz geometry, the counter): while autocast is on
for their inputs' device they compute in float32, with autocast off, and return
float32 (which the next autocast matrix product narrows again). Without autocast they
run unchanged in the inputs' dtype.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from polyfuse._checks import check_values

__all__ = [
    "FLOAT16_MAX",
    "autocast_device",
    "empty_output",
    "float32_call",
    "float32_under_autocast",
    "guarded_fuse",
    "needs_float32",
    "widen_under_autocast",
]

FLOAT16_MAX = float(torch.finfo(torch.float16).max)
_state = threading.local()  # widened: inside float32_call (weights and inputs float32)
_NARROW = (torch.float16, torch.bfloat16)
Function = TypeVar("Function", bound=Callable[..., Any])


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
        if check_values(grad) and bool(torch.isfinite(grad).all()) and not bool(torch.isfinite(cast).all()):
            raise ValueError(_advice(ctx.owner, "a gradient"))
        return cast, None, None


def _checked_cast(x: Tensor, dtype: torch.dtype, owner: str) -> Tensor:
    if x.dtype == dtype or not x.is_floating_point():
        return x
    return _CheckedCast.apply(x, dtype, owner)


def empty_output(module: nn.Module, sequences: Sequence[Tensor]) -> Tensor:
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
    options: dict[str, Any] | None = None,
) -> Any:
    """``fuse(sequences, masks)`` -> (B, out_dim), safe for B = 0 and float16 (see module docstring).

    ``sequences``: validated (B, T_j, d_j) inputs; ``masks``: (B, T_j) bool; ``options``:
    the keyword arguments of ``module.forward`` that select ``fuse`` (for the float32 call).
    """
    if sequences[0].shape[0] == 0:
        return empty_output(module, sequences)
    if not needs_float32(module, *sequences):
        return fuse(sequences, masks)
    return float32_call(module, (sequences, masks), options)


def needs_float32(module: nn.Module, *tensors: Tensor) -> bool:
    """True when an input or a weight is float16 (computed in float32 by :func:`float32_call`).

    A module may cache whether its weights are float16 in ``float16_weights`` (a
    :class:`~polyfuse.nn.FusionModule` does, refreshed whenever ``.to()`` / ``.half()``
    changes its weights): walking all parameters costs more than a small fusion.
    """
    half = torch.float16
    if getattr(_state, "widened", False):  # inside float32_call: weights are float32
        return False
    if any(x.dtype == half for x in tensors):
        return True
    cached = getattr(module, "float16_weights", None)
    if cached is not None:
        return cached
    return any(p.dtype == half for p in module.parameters())


def _map(value: Any, function: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(value, Tensor):
        return function(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple of outputs
        return type(value)(*(_map(v, function) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, function) for v in value)
    return value


def float32_call(module: nn.Module, args: tuple[Any, ...], options: dict[str, Any] | None = None) -> Any:
    """``module(*args, **options)`` computed in float32 (weights, buffers and float inputs
    widened), float outputs cast back to the inputs' dtype; float16 overflow is refused with
    a message. ``options`` are non-tensor keyword arguments (e.g. ``return_details``)."""
    owner = type(module).__name__
    dtypes = [x.dtype for x in _flatten(args) if x.is_floating_point()]
    dtype = dtypes[0] if dtypes else torch.float32
    state = {name: _checked_cast(p, torch.float32, owner) for name, p in module.named_parameters()}
    state.update({name: b.float() if b.is_floating_point() else b for name, b in module.named_buffers()})
    wide = _map(args, lambda x: _checked_cast(x, torch.float32, owner))
    previous = getattr(_state, "widened", False)
    _state.widened = True
    try:
        result = torch.func.functional_call(module, state, wide, options or {}, strict=False)
    finally:
        _state.widened = previous

    def narrow(x: Tensor) -> Tensor:
        if not x.is_floating_point() or x.dtype == dtype:
            return x
        if dtype == torch.float16 and check_values(x) and bool(torch.isfinite(x).all()) and not bool(torch.isfinite(x.to(dtype)).all()):
            raise ValueError(_advice(owner, "the output"))
        return _checked_cast(x, dtype, owner)

    return _map(result, narrow)


def _flatten(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return []


def autocast_device(*values: Any) -> str | None:
    """The device type of the first tensor in ``values`` (searched through lists and
    tuples) when autocast is enabled for it, else None."""
    for value in values:
        tensors = _flatten(value)
        if tensors:
            device_type = tensors[0].device.type
            return device_type if _autocast_enabled(device_type) else None
    return None


def _autocast_enabled(device_type: str) -> bool:
    # autocast exists for cpu, cuda, xpu, ... but not for meta (where asking would raise)
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def _to_float32(x: Tensor) -> Tensor:
    return x.float() if x.dtype in _NARROW else x


def widen_under_autocast(x: Tensor) -> Tensor:
    """``x`` in float32 while autocast is on for its device and it is float16 / bfloat16
    (for a softmax or a norm that must not run in the low dtype); else ``x`` itself."""
    return _to_float32(x) if x.dtype in _NARROW and _autocast_enabled(x.device.type) else x


def float32_under_autocast(function: Function) -> Function:
    """Decorator for a pure function of tensors: while autocast is enabled for the
    device of its first tensor argument, its float16 / bfloat16 tensor arguments
    (also inside lists and tuples) are widened to float32 and it runs with autocast
    disabled, so that every operation inside computes in float32 (or float64 for
    float64 inputs). Without autocast it is called unchanged."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device_type = autocast_device(*args, *kwargs.values())
        if device_type is None:
            return function(*args, **kwargs)
        with torch.autocast(device_type, enabled=False):
            return function(
                *_map(args, _to_float32), **{key: _map(value, _to_float32) for key, value in kwargs.items()}
            )

    return wrapper  # type: ignore[return-value]
