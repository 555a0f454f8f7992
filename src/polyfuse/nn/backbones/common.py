"""What the backbones share: padding hygiene, pooling and the extra fusion module.

Shapes: ``B`` batch, ``T_j`` steps of modality j, ``d_j`` its features, ``F`` the
extra module's output size.

A modality is *missing* for a sample when its mask has no real step (all zeros,
length 0 in a word-aligned file). The backbones zero every padded step on entry,
mask it out of every attention and pooling, and give a missing modality a zero
representation, so that nothing a missing or padded row holds reaches the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from polyfuse.functional import masked_mean

__all__ = ["ExtraFactory", "check_backbone_inputs", "extra_module_inputs", "pool_steps"]

ExtraFactory = Callable[[list[int]], nn.Module]  # input_dims -> a fusion module with out_dim


def check_backbone_inputs(
    inputs: Sequence[Tensor], masks: Sequence[Tensor] | None, input_dims: Sequence[int], owner: str
) -> tuple[list[Tensor], list[Tensor]]:
    """Validate (B, T_j, d_j) inputs and (B, T_j) bool masks; zero the padded steps.

    Unlike a fusion module's input check, a sample may have no real step in a
    modality (a missing modality).
    """
    if isinstance(inputs, Tensor) or len(inputs) != len(input_dims):
        raise ValueError(f"{owner}: expected a list of {len(input_dims)} modality tensors")
    if masks is None:
        masks = [torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) for x in inputs]
    if isinstance(masks, Tensor) or len(masks) != len(inputs):
        raise ValueError(f"{owner}: expected one mask per modality")
    cleaned = []
    for j, (x, mask, dim) in enumerate(zip(inputs, masks, input_dims, strict=True)):
        if x.dim() != 3 or x.shape[-1] != dim or not x.is_floating_point():
            raise ValueError(f"{owner}: modality {j} has shape {tuple(x.shape)} {x.dtype}; expected float (B, T, {dim})")
        if x.shape[0] != inputs[0].shape[0]:
            raise ValueError(f"{owner}: modality {j} has batch size {x.shape[0]}, modality 0 has {inputs[0].shape[0]}")
        if mask.dtype != torch.bool or mask.shape != x.shape[:2]:
            raise ValueError(f"{owner}: mask {j} must be bool of shape {tuple(x.shape[:2])}, got {mask.dtype} {tuple(mask.shape)}")
        # torch.where, not a product: a NaN in a padded or missing row must not survive.
        cleaned.append(torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device)))
    return cleaned, list(masks)


def pool_steps(x: Tensor, mask: Tensor, centre: Tensor | None, how: str) -> Tensor:
    """(B, T, d) -> (B, d): the ``centre`` step when given (contextual mode: the
    sample's own utterance), else the ``last`` real step or the ``mean`` of the
    real steps. A sample without real steps gets zeros."""
    present = mask.any(dim=1, keepdim=True)  # (B, 1)
    rows = torch.arange(x.shape[0], device=x.device)
    if centre is not None:
        picked = x[rows, centre]
    elif how == "last":
        last = (mask.long().cumsum(dim=1).argmax(dim=1))  # the index of the last real step
        picked = x[rows, last]
    elif how == "mean":
        picked = masked_mean(x, mask)
    else:
        raise ValueError(f"unknown pooling {how!r}; expected last or mean")
    return torch.where(present, picked, torch.zeros((), dtype=x.dtype, device=x.device))


def extra_module_inputs(sequences: Sequence[Tensor], masks: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """The extra fusion module's inputs: a missing modality becomes one zero step.

    Fusion modules refuse a sample without a real step (attention over an empty
    set is undefined); here such a sample sees a single real step holding zeros
    in that modality (step 0), whatever its rows held. No value is read on the
    host: samples with every modality present pass through unchanged.
    """
    new_inputs, new_masks = [], []
    for x, mask in zip(sequences, masks, strict=True):
        stand_in = torch.zeros_like(mask)
        stand_in[:, 0] = ~mask.any(dim=1)  # (B, T): step 0 of the samples without a real step
        new_inputs.append(torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device)))
        new_masks.append(mask | stand_in)
    return new_inputs, new_masks
