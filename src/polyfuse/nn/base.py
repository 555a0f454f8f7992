"""The one interface every fusion module implements.

Legend for shapes: ``B`` batch, ``T_j`` length of modality j, ``d_j`` its feature
size, ``m`` the number of modalities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from polyfuse._checks import inputs_checked, prepare_fusion_inputs
from polyfuse._precision import empty_output, guarded_fuse, needs_float32

__all__ = ["FusionModule", "FusionOutput"]


class FusionOutput(NamedTuple):
    """What every fusion module returns with ``return_details=True``.

    fused: (B, out_dim), what the module returns without details.
    sequences: the per-modality sequences after the module's last residual update,
        each (B, T_j, d), for modules that update sequences (MAN's residual layers,
        MAN Eq. 13; BAN's residual stream, BAN Eq. 14, with the first input
        unchanged); None for the others.
    attention: the module's attention weights, None for modules without attention
        (Concat, TFN, LMF). MAN: one entry per layer, (B, G, T_1, ..., T_m) in the
        exact and hadamard modes or a list of per-modality marginals (B, G, T_j) in
        had mode; BAN: the G bilinear maps (B, G, T_x, T_y); MAF-based modules
        (hoca, lowrank_hoca, maf): one (B, T_j) distribution per modality (HOCA
        Eq. 19). Each distribution is zero at padded steps and sums to one.
        For an empty batch (B = 0) both ``sequences`` and ``attention`` are None.
    modes: for MAN, the attention mode each layer computed in this call ("exact",
        "had" or "hadamard"; ``mode="auto"`` resolved per call); None for the others.
    """

    fused: Tensor
    sequences: list[Tensor] | None
    attention: Any
    modes: list[str] | None = None


class FusionModule(nn.Module):
    """Base class: ``forward(inputs, masks=None) -> (B, out_dim)``.

    Args:
        input_dims: feature size d_j of each modality, in input order.
        out_dim: size of the fused representation.

    ``inputs`` is a list of m tensors of shape (B, T_j, d_j), or (B, d_j) for a
    sequence of length 1; ``masks`` is None or a list of (B, T_j) bool tensors
    (True = a real step; None for a modality without padding). Padded steps are
    zeroed before :meth:`fuse` sees them and every mask is a tensor there, so a
    subclass only implements the fusion itself.
    """

    min_modalities: int = 2
    max_modalities: int | None = None
    registry_name: str = ""

    def __init__(self, input_dims: Sequence[int], out_dim: int) -> None:
        super().__init__()
        self._float16_weights: bool | None = None
        input_dims = [int(d) for d in input_dims]
        name = type(self).__name__
        count = len(input_dims)
        if count < self.min_modalities or (
            self.max_modalities is not None and count > self.max_modalities
        ):
            if self.max_modalities == self.min_modalities:
                expected = f"exactly {self.min_modalities}"
            else:
                expected = f"at least {self.min_modalities}"
                if self.max_modalities is not None:
                    expected += f" and at most {self.max_modalities}"
            raise ValueError(f"{name} takes {expected} modalities, got input_dims={input_dims}")
        if any(d <= 0 for d in input_dims) or out_dim <= 0:
            raise ValueError(f"{name}: sizes must be positive, got input_dims={input_dims}, out_dim={out_dim}")
        self.input_dims = input_dims
        self.out_dim = int(out_dim)

    @property
    def float16_weights(self) -> bool:
        """Whether a weight is float16 (cached: read on every forward by the float16 guard)."""
        if self._float16_weights is None:
            self._float16_weights = any(p.dtype == torch.float16 for p in self.parameters())
        return self._float16_weights

    def _apply(self, fn: Any, recurse: bool = True) -> FusionModule:
        self._float16_weights = None  # .to(), .half(), .float(), ...: look again
        return super()._apply(fn, recurse)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, (nn.Parameter, nn.Module)):
            self.__dict__["_float16_weights"] = None  # a new weight: look again
        super().__setattr__(name, value)

    @property
    def num_modalities(self) -> int:
        return len(self.input_dims)

    def forward(
        self,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None = None,
        *,
        return_details: bool = False,
    ) -> Tensor | FusionOutput:
        """Fuse the modalities: (B, out_dim), or a :class:`FusionOutput` when
        ``return_details`` (the same fused tensor, with sequences and attention)."""
        sequences, full_masks = prepare_fusion_inputs(
            inputs, masks, self.input_dims, type(self).__name__
        )
        if torch.compiler.is_compiling():
            # inputs_checked does nothing under torch.compile. A graph break inside fuse
            # (TFN's and LMF's eager LSTMs) cuts every frame between here and it into a
            # graph before and one after, and one inside a with-block makes dynamo give up
            # on the frame: fuse is called from here, with no with-block, where
            # guarded_fuse would call it (a non-empty batch, no float16).
            if not return_details and sequences[0].shape[0] and not needs_float32(self, *sequences):
                return self.fuse(sequences, full_masks)
            return self._fuse_checked(sequences, full_masks, return_details)
        with inputs_checked():  # inputs checked once, here; the math below checks shapes only
            return self._fuse_checked(sequences, full_masks, return_details)

    def _fuse_checked(self, sequences: list[Tensor], masks: list[Tensor], return_details: bool) -> Tensor | FusionOutput:
        if not return_details:
            return guarded_fuse(self, self.fuse, sequences, masks)  # B = 0, float16
        if sequences[0].shape[0] == 0:  # nothing to attend over: no sequences, no attention
            return FusionOutput(empty_output(self, sequences), None, None)
        return guarded_fuse(self, self.fuse_details, sequences, masks, {"return_details": True})

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        """Fuse validated (B, T_j, d_j) inputs with (B, T_j) bool masks into (B, out_dim)."""
        raise NotImplementedError

    def fuse_details(self, inputs: list[Tensor], masks: list[Tensor]) -> FusionOutput:
        """:meth:`fuse` with sequences and attention; modules that have them override it."""
        return FusionOutput(self.fuse(inputs, masks), None, None)

    def extra_repr(self) -> str:
        return f"input_dims={self.input_dims}, out_dim={self.out_dim}"
