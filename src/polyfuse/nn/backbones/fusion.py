"""The ``fusion`` backbone (``model.backbone: fusion``, the default): per-modality
encoders, a fusion module, a projection.

Shapes: ``B`` batch, ``T_j`` steps of modality j, ``d_j`` its input features,
``h`` the encoder size, ``F`` the fusion output size, ``D`` the backbone output.

``FusionBackbone.forward(inputs, masks, centre)``:

1. each modality goes through its encoder, step by step (``linear``: Linear,
   ReLU, dropout) or over its sequence (``gru``: a bidirectional GRU over the real
   steps, the setting of contextual models such as bc-LSTM), or unchanged (``none``);
2. optional input groups concatenate encoded modalities along features (BAN takes
   exactly two inputs: ``[[text], [audio, video]]``);
3. the fusion module (any module of :mod:`polyfuse.nn`) maps the encoded
   sequences and masks to (B, F). A *missing* modality (a sample with no real
   step in it, e.g. length 0 in word-aligned data) reaches the fusion module as
   one real step holding zeros, the neutral input that
   :func:`polyfuse.nn.backbones.extra_module_inputs` also gives the backbones'
   extra modules: fusion modules refuse an all-padding sample (attention over an
   empty set is undefined), and whatever the missing rows held cannot reach the
   output;
4. with ``skip``, each modality's own step (in contextual mode the ``centre``
   position: the utterance being predicted; otherwise the mean of its real
   steps) is concatenated to the fused vector, so that the fusion adds context
   to, rather than replaces, the sample itself. The skip path is unfused: a model
   with it contains the Concat baseline, so comparisons of fusion methods turn it
   off; in contextual mode they set ``centre_marker`` instead, which appends to
   every step of every modality one input channel, 1 at the centre and 0
   elsewhere, so that the fused vector can still tell which utterance is
   predicted (without it, all the samples of one window get the same output);
5. a projection (Linear, ReLU, dropout) gives (B, D).

The module holds no training code; a task (:mod:`polyfuse.tasks`) puts its head
on top.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from polyfuse.functional import masked_mean
from polyfuse.nn.backbones.common import extra_module_inputs

__all__ = ["ENCODER_TYPES", "FusionBackbone", "ModalityEncoder"]

ENCODER_TYPES = ("none", "linear", "gru")


class ModalityEncoder(nn.Module):
    """(B, T, d) -> (B, T, h) for one modality; padded steps come out zero."""

    def __init__(self, input_dim: int, *, kind: str = "linear", hidden_dim: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        if kind not in ENCODER_TYPES:
            raise ValueError(f"unknown encoder type {kind!r}; expected one of {', '.join(ENCODER_TYPES)}")
        if kind == "gru" and hidden_dim % 2:
            raise ValueError(f"a gru encoder needs an even hidden_dim (two directions), got {hidden_dim}")
        self.kind = kind
        self.output_dim = input_dim if kind == "none" else int(hidden_dim)
        self.dropout = nn.Dropout(dropout)
        if kind == "linear":
            self.layer = nn.Linear(input_dim, hidden_dim)
        elif kind == "gru":
            self.layer = nn.GRU(input_dim, hidden_dim // 2, batch_first=True, bidirectional=True)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if self.kind == "none":
            return x * mask.unsqueeze(-1)
        if self.kind == "linear":
            encoded = torch.relu(self.layer(self.dropout(x)))
        else:
            lengths = mask.sum(dim=1).clamp_min(1).cpu()
            packed = pack_padded_sequence(self.dropout(x), lengths, batch_first=True, enforce_sorted=False)
            output, _ = self.layer(packed)
            encoded, _ = pad_packed_sequence(output, batch_first=True, total_length=x.shape[1])
        return self.dropout(encoded) * mask.unsqueeze(-1)


class FusionBackbone(nn.Module):
    """Encoders, fusion, skip and projection (see the module docstring).

    Args:
        fusion: a fusion module with ``forward(inputs, masks) -> (B, F)`` whose
            inputs are the encoded groups.
        encoders: one :class:`ModalityEncoder` per modality.
        groups: lists of modality indices whose encoded sequences are
            concatenated into one fusion input (default: one group per modality);
            modalities of one group must have equal lengths.
        fusion_dim: F.
        skip: concatenate each modality's encoded ``centre`` step to the fused vector.
        centre_marker: append a channel marking the ``centre`` step (1, else 0) to
            every modality's input; the encoders must then take d_j + 1 features.
        out_dim: D.
        dropout: dropout after the projection.
        modality_names: for messages and plots.
    """

    takes_centre = True  # FusionTask passes the batch's centre positions

    def __init__(
        self,
        fusion: nn.Module,
        encoders: Sequence[ModalityEncoder],
        *,
        fusion_dim: int,
        out_dim: int,
        groups: Sequence[Sequence[int]] | None = None,
        skip: bool = True,
        centre_marker: bool = False,
        dropout: float = 0.0,
        modality_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.fusion = fusion
        self.encoders = nn.ModuleList(encoders)
        count = len(self.encoders)
        self.groups = [list(g) for g in groups] if groups else [[j] for j in range(count)]
        used = sorted(j for g in self.groups for j in g)
        if any(j < 0 or j >= count for j in used) or len(set(used)) != len(used):
            raise ValueError(f"input groups {self.groups} must use each of the {count} modalities at most once")
        self.skip = bool(skip)
        self.centre_marker = bool(centre_marker)
        self.out_dim = int(out_dim)
        self.modality_names = list(modality_names or [f"m{j}" for j in range(count)])
        skip_dim = sum(e.output_dim for e in self.encoders) if self.skip else 0
        self.projection = nn.Sequential(
            nn.Linear(fusion_dim + skip_dim, self.out_dim), nn.ReLU(), nn.Dropout(dropout)
        )

    def group_dims(self) -> list[int]:
        """The feature size of each fusion input."""
        return [sum(self.encoders[j].output_dim for j in group) for group in self.groups]

    def group_names(self) -> list[str]:
        return ["+".join(self.modality_names[j] for j in group) for group in self.groups]

    def encode(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> list[Tensor]:
        """(B, T_j, d_j) -> (B, T_j, h_j) per modality."""
        if len(inputs) != len(self.encoders):
            raise ValueError(f"the backbone has {len(self.encoders)} modalities, got {len(inputs)} inputs")
        return [encoder(x, m) for encoder, x, m in zip(self.encoders, inputs, masks, strict=True)]

    def fusion_inputs(self, encoded: Sequence[Tensor], masks: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """The fusion module's inputs and masks: encoded modalities, grouped."""
        grouped, group_masks = [], []
        for group in self.groups:
            if len({tuple(encoded[j].shape[:2]) for j in group}) > 1:
                raise ValueError(
                    f"input group {[self.modality_names[j] for j in group]} mixes sequences of different lengths"
                )
            grouped.append(torch.cat([encoded[j] for j in group], dim=-1))
            group_masks.append(masks[group[0]])
        return grouped, group_masks

    def mark_centre(self, inputs: Sequence[Tensor], centre: Tensor | None) -> list[Tensor]:
        """(B, T_j, d_j) -> (B, T_j, d_j + 1): a last channel, 1 at the centre step."""
        if centre is None:
            raise ValueError(
                "centre_marker needs the centre positions of contextual data (data.context); "
                "turn it off for samples that are not windows"
            )
        marked = []
        for x in inputs:
            marker = torch.zeros(*x.shape[:2], 1, dtype=x.dtype, device=x.device)
            marker[torch.arange(x.shape[0], device=x.device), centre] = 1.0
            marked.append(torch.cat([x, marker], dim=-1))
        return marked

    def forward(self, inputs: Sequence[Tensor], masks: Sequence[Tensor], centre: Tensor | None = None) -> Tensor:
        if self.centre_marker:
            inputs = self.mark_centre(inputs, centre)
        encoded = self.encode(inputs, masks)
        fused = self.fusion(*extra_module_inputs(*self.fusion_inputs(encoded, masks)))  # (B, F)
        parts = [fused]
        if self.skip and centre is not None:
            rows = torch.arange(fused.shape[0], device=fused.device)
            parts.extend(x[rows, centre] for x in encoded)  # (B, h_j) each
        elif self.skip:
            parts.extend(masked_mean(x, m) for x, m in zip(encoded, masks, strict=True))
        return self.projection(torch.cat(parts, dim=-1))
