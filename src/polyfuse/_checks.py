"""Input validation shared by the functional core and the fusion modules.

Every check raises a ``ValueError`` whose message names the modality (by its
index in the input list) and what is wrong with it, so that a bad batch is
reported where it enters the library instead of deep inside a kernel.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

__all__ = [
    "VALIDATION_LEVELS",
    "check_all_finite",
    "check_dropout",
    "check_finite",
    "check_float_tensor",
    "check_hyperboloid_points",
    "check_mask",
    "check_masks",
    "check_modality_list",
    "check_stacked_steps",
    "check_values",
    "get_validation",
    "inputs_checked",
    "prepare_fusion_inputs",
    "reads_synchronise",
    "set_validation",
    "validation",
]


#: ``"auto"`` (default): ``"full"`` for tensors on the CPU, ``"shapes"`` for tensors on any
#: other device (a CUDA GPU): reading a value back from a GPU makes the host wait for it,
#: so there a forward never synchronises, and values are checked once where they enter,
#: at the data boundary (polyfuse's data pipeline checks its files when it loads them).
#: ``"full"``: shapes, dtypes and values (NaN / Inf at real steps, all-padding samples,
#: out-of-range entries) are checked on every call, on every device. ``"shapes"``: only
#: what is known without reading a tensor (shapes, dtypes, sizes), on every device;
#: values are then the caller's responsibility.
VALIDATION_LEVELS = ("auto", "full", "shapes")
_validation = "auto"
# True inside a fusion module's forward once its inputs passed the value checks: the
# functional calls it makes then check shapes only (see inputs_checked).
# (Thread-local: another thread's forward must not switch this thread's checks off.)
_state = threading.local()


def set_validation(level: str) -> None:
    """Choose how much every polyfuse call checks: ``"auto"`` (default: values on the CPU
    only), ``"full"`` or ``"shapes"`` (see :data:`VALIDATION_LEVELS`).

    Under ``torch.compile`` value checks are skipped whatever the level (they would
    break the graph); eager calls follow the level.
    """
    global _validation
    if level not in VALIDATION_LEVELS:
        raise ValueError(f"unknown validation level {level!r}; expected one of {', '.join(VALIDATION_LEVELS)}")
    _validation = level


def get_validation() -> str:
    """The current validation level (see :func:`set_validation`)."""
    return _validation


@contextlib.contextmanager
def validation(level: str) -> Iterator[None]:
    """:func:`set_validation` for a ``with`` block; the previous level comes back after it."""
    previous = get_validation()
    set_validation(level)
    try:
        yield
    finally:
        set_validation(previous)


def check_values(tensor: Tensor) -> bool:
    """True when value checks of ``tensor`` (which read it back to the host) should run:
    at level ``"full"``, and at ``"auto"`` when it lives where a read costs no wait for a
    device (:func:`reads_synchronise`); never under ``torch.compile``."""
    if _validation == "shapes" or torch.compiler.is_compiling():
        return False
    return _validation == "full" or not reads_synchronise(tensor.device)


def reads_synchronise(device: torch.device) -> bool:
    """Whether reading a tensor's value on ``device`` back to Python waits for the device
    (every device but the CPU and ``meta``, which has no values)."""
    return device.type not in ("cpu", "meta")


def _check_inputs(tensor: Tensor) -> bool:
    """:func:`check_values`, except inside a module whose inputs were checked on entry
    (:class:`inputs_checked`): there the functions it calls do not check their inputs
    again; checks of intermediate values (overflowing logits) still run."""
    return check_values(tensor) and not getattr(_state, "inputs_checked", False)


class inputs_checked:
    """For the body of a module's forward whose inputs were checked on entry: the
    functional calls inside check shapes only, so values are read once per call of
    the module, not again by every function it calls. Does
    nothing under ``torch.compile``, where no value is checked."""

    def __enter__(self) -> None:
        if not torch.compiler.is_compiling():
            self.previous = getattr(_state, "inputs_checked", False)
            _state.inputs_checked = True

    def __exit__(self, *exc_info: object) -> None:
        if not torch.compiler.is_compiling():
            _state.inputs_checked = self.previous


def check_modality_list(
    tensors: Sequence[Tensor], what: str, *, min_count: int = 2, max_count: int | None = None
) -> None:
    """Check that ``tensors`` is a list of tensors of an allowed length."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence):
        raise ValueError(
            f"{what} must be a list with one tensor per modality, got {type(tensors).__name__}"
        )
    count = len(tensors)
    if count < min_count or (max_count is not None and count > max_count):
        allowed = (
            f"exactly {min_count}"
            if max_count == min_count
            else f"at least {min_count}"
            + ("" if max_count is None else f" and at most {max_count}")
        )
        raise ValueError(f"{what}: expected {allowed} modalities, got {count}")
    for j, tensor in enumerate(tensors):
        if not isinstance(tensor, Tensor):
            raise ValueError(f"{what}[{j}] (modality {j}) is a {type(tensor).__name__}, not a tensor")


def check_finite(tensor: Tensor, what: str, mask: Tensor | None = None) -> None:
    """Raise if ``tensor`` holds NaN or Inf at a real (unmasked) position.

    ``tensor`` has shape (..., T, d) and ``mask`` (..., T) with True at real steps.
    Skipped unless :func:`check_values`, and for the already checked inputs of a module.
    """
    if not _check_inputs(tensor):
        return
    if bool(torch.isfinite(tensor.detach().sum())):
        return  # one pass: a sum is finite only if every term is (NaN and Inf propagate)
    bad = ~torch.isfinite(tensor)
    if mask is not None:
        bad = bad & mask.unsqueeze(-1)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        kind = "NaN" if bool(torch.isnan(tensor[tuple(where)])) else "Inf"
        raise ValueError(f"{what} contains {kind} at index {tuple(where)}")


def check_all_finite(tensors: Sequence[tuple[Tensor, str, Tensor | None]]) -> None:
    """:func:`check_finite` for several (tensor, what, mask) triples behind one test: a sum
    is finite whenever all its terms are, so only a NaN, an Inf (or an overflowing sum)
    pays for the full checks, which name the first tensor at fault. Skipped like
    :func:`check_finite`."""
    if not tensors or not _check_inputs(tensors[0][0]):
        return
    with torch.no_grad():
        sums = torch.stack([tensor.sum() for tensor, _, _ in tensors]).tolist()
    if all(map(math.isfinite, sums)):  # on the host: an isfinite and an all cost more (CPU)
        return
    for tensor, what, mask in tensors:
        check_finite(tensor, what, mask)


def check_mask(mask: object, shape: torch.Size | tuple[int, ...], what: str) -> Tensor:
    """Validate one bool mask (True = real step) and expand it to ``shape`` (..., T).

    Raises when it is not a bool tensor, does not broadcast to ``shape``, or leaves a
    sample with no real step: attention over an empty set is undefined, and we
    refuse rather than return NaN.
    """
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{what} must be a bool tensor (True = real step)")
    try:
        mask = mask.expand(shape)
    except RuntimeError:
        raise ValueError(f"{what} has shape {tuple(mask.shape)}, expected {tuple(shape)}") from None
    if not _check_inputs(mask):
        return mask
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        rows = [tuple(row) if len(row) > 1 else row[0] for row in empty.nonzero().tolist()[:10]]
        raise ValueError(
            f"{what} is all padding for sample(s) {rows}: "
            "every sample needs at least one real step"
        )
    return mask


def check_stacked_steps(mask: Tensor, lengths: Sequence[int], what: str) -> None:
    """Raise when a sample of a mask (..., T) of modalities stacked along time (modality j
    at the steps sum_{i<j} T_i .. sum_{i<=j} T_i - 1) has no real step in some modality.
    One host read for all modalities; skipped unless :func:`check_values`."""
    if not _check_inputs(mask):
        return
    empty = torch.stack([~part.any(-1) for part in mask.split(list(lengths), -1)], -1)  # (..., m)
    if bool(empty.any()):
        where = empty.nonzero()[0].tolist()
        raise ValueError(
            f"{what}: modality {where[-1]} is all padding for sample {tuple(where[:-1])}: "
            "every sample needs at least one real step in every modality"
        )


def check_masks(
    masks: Sequence[Tensor | None] | None, tensors: Sequence[Tensor], what: str = "masks"
) -> list[Tensor]:
    """Validate masks against tensors of shape (..., T_j, d) and fill in missing ones.

    Returns one bool mask of shape (..., T_j) per modality (all True where None was
    given). Raises when a sample has no real step in some modality: attention over
    an empty set is undefined, and we refuse rather than return NaN.
    """
    if masks is None:
        masks = [None] * len(tensors)
    if isinstance(masks, Tensor) or len(masks) != len(tensors):
        raise ValueError(
            f"{what}: expected a list of {len(tensors)} masks (or None), "
            f"got {type(masks).__name__ if isinstance(masks, Tensor) else len(masks)}"
        )
    result, given, ones = [], [], {}
    with _shapes_only():  # the masks' values are checked below, all behind one host read
        for j, (mask, tensor) in enumerate(zip(masks, tensors, strict=True)):
            expected = tensor.shape[:-1]
            if mask is None:  # modalities of one shape share one all-True mask
                key = (expected, tensor.device)
                if key not in ones:
                    ones[key] = torch.ones(expected, dtype=torch.bool, device=tensor.device)
                result.append(ones[key])
                continue
            result.append(check_mask(mask, expected, f"{what}[{j}] (modality {j})"))
            given.append(j)
    if given and _check_inputs(result[given[0]]):
        real = torch.cat([result[j].any(-1).flatten() for j in given])  # one entry per sample and mask
        if not bool(real.all()):  # name the first mask at fault
            for j in given:
                check_mask(result[j], result[j].shape, f"{what}[{j}] (modality {j})")
    return result


@contextlib.contextmanager
def _shapes_only() -> Iterator[None]:
    """Within the block, checks of inputs read no value (as inside :class:`inputs_checked`)."""
    if torch.compiler.is_compiling():
        yield
        return
    previous = getattr(_state, "inputs_checked", False)
    _state.inputs_checked = True
    try:
        yield
    finally:
        _state.inputs_checked = previous


def prepare_fusion_inputs(
    inputs: Sequence[Tensor],
    masks: Sequence[Tensor | None] | None,
    input_dims: Sequence[int],
    owner: str,
) -> tuple[list[Tensor], list[Tensor]]:
    """Validate the common fusion-module input and bring it to a canonical form.

    Args:
        inputs: one tensor per modality, (B, T_j, d_j) or (B, d_j) (a sequence of length 1).
        masks: None, or one (B, T_j) bool tensor or None per modality; True marks a real step.
        input_dims: the feature size d_j the module was built for, per modality.
        owner: the module's name, used in error messages.

    Returns:
        ``(sequences, masks)``: (B, T_j, d_j) tensors whose padded steps are zeroed
        (so their content can never leak into the result) and (B, T_j) bool masks.
    """
    count = len(input_dims)
    check_modality_list(inputs, f"{owner} inputs", min_count=count, max_count=count)
    sequences = []
    for j, (x, dim) in enumerate(zip(inputs, input_dims, strict=True)):
        if x.dim() == 2:
            x = x.unsqueeze(1)
        if x.dim() != 3:
            raise ValueError(
                f"{owner}: modality {j} has shape {tuple(x.shape)}; expected (B, T, {dim}) or (B, {dim})"
            )
        if not x.is_floating_point():
            raise ValueError(f"{owner}: modality {j} has dtype {x.dtype}; expected a float tensor")
        if x.shape[-1] != dim:
            raise ValueError(
                f"{owner}: modality {j} has feature size {x.shape[-1]}, but the module was "
                f"built with input_dims[{j}] = {dim}"
            )
        if x.shape[0] != inputs[0].shape[0]:
            raise ValueError(
                f"{owner}: modality {j} has batch size {x.shape[0]}, modality 0 has {inputs[0].shape[0]}"
            )
        if x.shape[1] == 0:
            raise ValueError(f"{owner}: modality {j} is an empty sequence (T = 0)")
        sequences.append(x)
    full_masks = check_masks(
        None if masks is None else [m if m is None or m.dim() != 1 else m[:, None] for m in masks],
        sequences,
        f"{owner} masks",
    )
    check_all_finite([
        (x, f"{owner}: modality {j}", mask) for j, (x, mask) in enumerate(zip(sequences, full_masks, strict=True))
    ])  # one host read for all modalities
    given = [None] * count if masks is None else masks
    # Zero the padded steps; a modality without a mask has none (no copy).
    cleaned = [
        x if mask_given is None else x.masked_fill(~mask.unsqueeze(-1), 0.0)
        for x, mask, mask_given in zip(sequences, full_masks, given, strict=True)
    ]
    return cleaned, full_masks


def check_dropout(dropout: float, owner: str, name: str = "dropout") -> float:
    """A dropout probability in [0, 1), as a float; ``name`` is the option in messages."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{owner}: {name} must lie in [0, 1), got {dropout}")
    return float(dropout)


def check_float_tensor(tensor: object, name: str, *, min_dim: int = 1) -> None:
    """A floating-point tensor with at least ``min_dim`` dimensions."""
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got dtype {tensor.dtype}")
    if tensor.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(tensor.shape)}")


def check_hyperboloid_points(
    points: object, name: str, *, mask: Tensor | None = None, min_dim: int = 1
) -> None:
    """Points of the Lorentz model: (..., n + 1) with n >= 1, finite at real positions."""
    check_float_tensor(points, name, min_dim=min_dim)
    if points.shape[-1] < 2:
        raise ValueError(
            f"{name} must have n + 1 >= 2 coordinates in its last dim (time first), "
            f"got shape {tuple(points.shape)}"
        )
    check_finite(points, name, mask)
