"""The Transformer setting of MAN (MAN appendix H.1): MulT plus an auxiliary fusion module.

MulT (Tsai et al., ACL 2019), generalised from three to m >= 2 modalities:

1. each modality is projected to D features by a kernel-1 temporal convolution
   without bias (a per-step Linear; MulT Section 3.2);
2. for every ordered pair (source beta, target alpha), a crossmodal Transformer
   CM_{beta -> alpha} of ``layers`` layers lets alpha attend to beta (MulT Eq. 3);
3. per target alpha, the outputs from its m - 1 sources are concatenated,
   (B, T_alpha, (m - 1) D), and pass a self-attention Transformer of
   max(``layers``, 3) layers (MulT's "memory");
4. the last real step of each (or, in contextual mode, the ``centre`` step) is
   taken and the m vectors concatenated: (B, m (m - 1) D);
5. a residual two-layer projection: ``h + W_2 dropout(relu(W_1 h))``.

MulT's output layer is the task head on top. The auxiliary module (any registered
fusion module, MAN by default in the configs) fuses the projected sequences of
step 1 into (B, F); its representation is concatenated to MulT's. A Linear head
over the concatenation ``[h_MulT, h_aux]`` equals ``W_a h_MulT + W_b h_aux + b``:
MulT's prediction plus the auxiliary module's prediction, the "simple addition"
of MAN appendix H.1.

Shapes: ``B`` batch, ``T_j`` steps of modality j, ``d_j`` its features, ``D``
MulT's model size, ``F`` the auxiliary output size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from polyfuse.nn.backbones.common import (
    ExtraFactory,
    check_backbone_inputs,
    extra_module_inputs,
    pool_steps,
)
from polyfuse.nn.backbones.registry import register
from polyfuse.nn.backbones.transformer import CrossmodalEncoder

__all__ = ["MulT"]


@register("mult")
class MulT(nn.Module):
    """MulT with an optional auxiliary fusion module (see the module docstring).

    Args:
        input_dims: d_j per modality (m >= 2).
        extra: None, or a callable ``input_dims -> fusion module`` building the
            auxiliary module over the m projected sequences (each of size ``dim``).
        dim: D (MulT: 30).
        heads: attention heads (MulT: 5).
        layers: crossmodal layers (MulT: 5; the memory has max(layers, 3)).
        attention_dropout, relu_dropout, residual_dropout, embed_dropout,
        output_dropout: MulT's dropouts (0.1, 0.1, 0.1, 0.25, 0.0 by default).
        modality_names: for messages.

    ``forward(inputs, masks, centre=None) -> (B, out_dim)`` with
    ``out_dim = m (m - 1) D + F``.
    """

    takes_centre = True

    def __init__(
        self,
        input_dims: Sequence[int],
        *,
        extra: ExtraFactory | None = None,
        dim: int = 30,
        heads: int = 5,
        layers: int = 5,
        attention_dropout: float = 0.1,
        relu_dropout: float = 0.1,
        residual_dropout: float = 0.1,
        embed_dropout: float = 0.25,
        output_dropout: float = 0.0,
        modality_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.input_dims = [int(d) for d in input_dims]
        count = len(self.input_dims)
        if count < 2:
            raise ValueError(f"MulT needs at least 2 modalities, got input_dims={self.input_dims}")
        self.modality_names = list(modality_names or [f"m{j}" for j in range(count)])
        self.dim, self.embed_dropout, self.output_dropout = int(dim), float(embed_dropout), float(output_dropout)
        dropouts = {"attention_dropout": attention_dropout, "relu_dropout": relu_dropout,
                    "residual_dropout": residual_dropout, "embed_dropout": embed_dropout}
        self.projections = nn.ModuleList(nn.Linear(d, self.dim, bias=False) for d in self.input_dims)
        # crossmodal[alpha][k]: CM_{beta -> alpha} for the k-th source beta != alpha, in index order
        self.crossmodal = nn.ModuleList(
            nn.ModuleList(CrossmodalEncoder(self.dim, heads, layers, **dropouts) for _ in range(count - 1))
            for _ in range(count)
        )
        memory_dim = (count - 1) * self.dim
        self.memories = nn.ModuleList(
            CrossmodalEncoder(memory_dim, heads, max(layers, 3), **dropouts) for _ in range(count)
        )
        combined = count * memory_dim
        self.project_in = nn.Linear(combined, combined)
        self.project_out = nn.Linear(combined, combined)
        self.extra = extra([self.dim] * count) if extra is not None else None
        self.mult_dim = combined
        self.out_dim = combined + (int(self.extra.out_dim) if self.extra is not None else 0)

    def forward(self, inputs: Sequence[Tensor], masks: Sequence[Tensor] | None = None,
                centre: Tensor | None = None) -> Tensor:
        inputs, masks = check_backbone_inputs(inputs, masks, self.input_dims, "MulT")
        # MulT drops out the text input before projecting; here every modality's input.
        projected = [
            projection(F.dropout(x, self.embed_dropout, self.training)) * m.unsqueeze(-1)
            for projection, x, m in zip(self.projections, inputs, masks, strict=True)
        ]  # (B, T_j, D) each
        pooled = []
        for alpha, (target, target_mask) in enumerate(zip(projected, masks, strict=True)):
            sources = [beta for beta in range(len(projected)) if beta != alpha]
            crossed = [
                encoder(target, target_mask, projected[beta], masks[beta])
                for encoder, beta in zip(self.crossmodal[alpha], sources, strict=True)
            ]  # MulT Eq. 3, (B, T_alpha, D) each
            memory = self.memories[alpha](torch.cat(crossed, dim=-1), target_mask)  # (B, T_alpha, (m-1) D)
            pooled.append(pool_steps(memory, target_mask, centre, "last"))
        last = torch.cat(pooled, dim=-1)  # (B, m (m-1) D)
        hidden = self.project_out(F.dropout(F.relu(self.project_in(last)), self.output_dropout, self.training))
        parts = [hidden + last]
        if self.extra is not None:
            parts.append(self.extra(*extra_module_inputs(projected, masks)))  # (B, F)
        return torch.cat(parts, dim=-1)
