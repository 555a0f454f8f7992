"""Input validation shared by the functional core and the fusion modules.

Every check raises a ``ValueError`` whose message names the modality (by its
index in the input list) and what is wrong with it, so that a bad batch is
reported where it enters the library instead of deep inside a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "check_dropout",
    "check_finite",
    "check_float_tensor",
    "check_hyperboloid_points",
    "check_mask",
    "check_masks",
    "check_modality_list",
    "prepare_fusion_inputs",
]


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
    """
    if bool(torch.isfinite(tensor.detach().sum())):
        return  # one pass: a sum is finite only if every term is (NaN and Inf propagate)
    bad = ~torch.isfinite(tensor)
    if mask is not None:
        bad = bad & mask.unsqueeze(-1)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        kind = "NaN" if bool(torch.isnan(tensor[tuple(where)])) else "Inf"
        raise ValueError(f"{what} contains {kind} at index {tuple(where)}")


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
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        rows = [tuple(row) if len(row) > 1 else row[0] for row in empty.nonzero().tolist()[:10]]
        raise ValueError(
            f"{what} is all padding for sample(s) {rows}: "
            "every sample needs at least one real step"
        )
    return mask


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
    result = []
    for j, (mask, tensor) in enumerate(zip(masks, tensors, strict=True)):
        expected = tensor.shape[:-1]
        if mask is None:
            result.append(torch.ones(expected, dtype=torch.bool, device=tensor.device))
            continue
        result.append(check_mask(mask, expected, f"{what}[{j}] (modality {j})"))
    return result


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
    cleaned = []
    for j, (x, mask) in enumerate(zip(sequences, full_masks, strict=True)):
        check_finite(x, f"{owner}: modality {j}", mask)
        cleaned.append(x.masked_fill(~mask.unsqueeze(-1), 0.0))
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
