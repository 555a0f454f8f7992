"""The one interface every fusion module implements.

Legend for shapes: ``B`` batch, ``T_j`` length of modality j, ``d_j`` its feature
size, ``m`` the number of modalities.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from polyfuse._checks import prepare_fusion_inputs
from polyfuse._precision import guarded_fuse

__all__ = ["FusionModule"]


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
    def num_modalities(self) -> int:
        return len(self.input_dims)

    def forward(
        self, inputs: Sequence[Tensor], masks: Sequence[Tensor | None] | None = None
    ) -> Tensor:
        sequences, full_masks = prepare_fusion_inputs(
            inputs, masks, self.input_dims, type(self).__name__
        )
        return guarded_fuse(self, self.fuse, sequences, full_masks)  # B = 0, float16

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        """Fuse validated (B, T_j, d_j) inputs with (B, T_j) bool masks into (B, out_dim)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"input_dims={self.input_dims}, out_dim={self.out_dim}"
