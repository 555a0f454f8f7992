"""Text-video retrieval heads: a video embedding fused from experts, a text embedding.

Shapes: ``B`` videos (or captions), ``m`` experts, ``T_j`` steps of expert j, ``d_j``
its feature size, ``D`` the joint embedding size, ``d_t`` the text encoder's size.

Video side (MAN section 3.3): the experts are the modalities of a fusion module.

* ``"man"``: :class:`polyfuse.nn.MAN` fuses all experts' steps jointly into one vector.
* ``"concat"``: :class:`polyfuse.nn.Concat` (masked-mean per expert, concatenation, MLP).
* ``"mean"``: mean of experts: each expert is masked-mean pooled and linearly
  projected to D, and the projections of the experts a video has are averaged.

A video that lacks expert j (``present[:, j]`` False): its steps of expert j are masked,
never read. MAN's joint attention is undefined over an empty modality (it refuses it),
so for MAN and Concat the expert is represented by one learned *absent* step (a
parameter per expert, shared by all videos, whose content is learned); the mean of
experts simply leaves the expert out of the average.

Text side: one pooled vector per caption (the encoder's mean over tokens) through a
linear map. MAN gives one joint video vector, not one vector per expert, so the
per-expert text embeddings and mixture weights of collaborative experts (which
compare expert by expert) have nothing to attach to; a single pooled vector is the
matching choice. Both embeddings are L2-normalised: scores are cosines.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from polyfuse import nn as pnn
from polyfuse.functional.pooling import masked_mean

__all__ = ["VIDEO_FUSIONS", "ExpertVideoEncoder", "RetrievalModel"]

VIDEO_FUSIONS = ("man", "concat", "mean")


class ExpertVideoEncoder(nn.Module):
    """Experts -> one (B, D) unit vector per video.

    Args:
        expert_dims: d_j of each expert, in order.
        embed_dim: D.
        fusion: one of ``VIDEO_FUSIONS``.
        hidden_dim: hidden size of MAN / Concat.
        fusion_options: extra keyword arguments of the fusion module (e.g. MAN's heads).
    """

    def __init__(
        self,
        expert_dims: Sequence[int],
        embed_dim: int,
        *,
        fusion: str = "man",
        hidden_dim: int = 64,
        fusion_options: dict | None = None,
    ) -> None:
        super().__init__()
        if fusion not in VIDEO_FUSIONS:
            raise ValueError(f"unknown video fusion {fusion!r}; available: {', '.join(VIDEO_FUSIONS)}")
        self.expert_dims = [int(d) for d in expert_dims]
        self.fusion_name = fusion
        if fusion == "mean":
            self.projections = nn.ModuleList(nn.Linear(d, embed_dim) for d in self.expert_dims)
        else:
            if len(self.expert_dims) < 2:
                raise ValueError(f"{fusion} fuses at least 2 experts, got {len(self.expert_dims)}")
            self.absent = nn.ParameterList(nn.Parameter(torch.zeros(d)) for d in self.expert_dims)
            self.fusion = pnn.create(
                fusion, input_dims=self.expert_dims, out_dim=embed_dim, hidden_dim=hidden_dim,
                **(fusion_options or {}),
            )

    def forward(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        """Args: ``features`` m tensors (B, T_j, d_j); ``masks`` m (B, T_j) bool;
        ``present`` (B, m) bool. Returns (B, D), L2-normalised."""
        if len(features) != len(self.expert_dims) or len(masks) != len(features):
            raise ValueError(f"expected {len(self.expert_dims)} experts, got {len(features)}")
        if present.shape != (features[0].shape[0], len(features)):
            raise ValueError(f"present has shape {tuple(present.shape)}, expected (B, {len(features)})")
        if not bool(present.any(dim=1).all()):
            raise ValueError("a video of the batch has no expert at all")
        if self.fusion_name == "mean":
            pooled = torch.stack(
                [proj(masked_mean(x, m)) for proj, x, m in zip(self.projections, features, masks, strict=True)],
                dim=1,
            )  # (B, m, D)
            weights = present.to(pooled.dtype).unsqueeze(-1)
            fused = (pooled * weights).sum(1) / weights.sum(1)
        else:
            inputs, input_masks = [], []
            for j, (x, m) in enumerate(zip(features, masks, strict=True)):
                here = present[:, j]
                m = m & here.unsqueeze(1)  # an absent expert's steps are never read
                absent_step = self.absent[j].to(x.dtype).expand(x.shape[0], 1, -1)
                inputs.append(torch.cat((absent_step, x), dim=1))
                input_masks.append(torch.cat(((~here).unsqueeze(1), m), dim=1))
            fused = self.fusion(inputs, input_masks)
        return nn.functional.normalize(fused, dim=-1)


class RetrievalModel(nn.Module):
    """A text head and a video encoder into one cosine space.

    Args:
        text_dim: d_t of the sentence vectors. expert_dims, embed_dim, fusion,
        hidden_dim, fusion_options: of :class:`ExpertVideoEncoder`.
    """

    def __init__(
        self,
        text_dim: int,
        expert_dims: Sequence[int],
        *,
        embed_dim: int = 256,
        fusion: str = "man",
        hidden_dim: int = 64,
        fusion_options: dict | None = None,
    ) -> None:
        super().__init__()
        self.text_head = nn.Linear(text_dim, embed_dim)
        self.video = ExpertVideoEncoder(
            expert_dims, embed_dim, fusion=fusion, hidden_dim=hidden_dim, fusion_options=fusion_options
        )

    def embed_texts(self, sentence_vectors: Tensor) -> Tensor:
        """(B, d_t) -> (B, D) unit vectors."""
        return nn.functional.normalize(self.text_head(sentence_vectors), dim=-1)

    def embed_videos(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        return self.video(features, masks, present)
