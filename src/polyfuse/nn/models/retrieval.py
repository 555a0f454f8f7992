"""Text-video retrieval heads: a video embedding fused from experts, a text embedding.

Shapes: ``B`` videos (or captions), ``m`` experts, ``T_j`` steps of expert j, ``d_j``
its feature size, ``D`` the joint embedding size, ``d_t`` the text encoder's size.

Video side (MAN section 3.3): the experts are the modalities of a fusion module.

* ``"man"``: :class:`polyfuse.nn.MAN` fuses all experts' steps jointly into one vector.
* ``"concat"``: :class:`polyfuse.nn.Concat` (masked-mean per expert, concatenation, MLP).
* ``"mean"``: mean of experts: each expert is masked-mean pooled and linearly
  projected to D, and the projections of the experts a video has are averaged.
* ``"gating"``: the collaborative gating of collaborative experts (Liu, Albanie,
  Nagrani and Zisserman, BMVC 2019, section 3): each pooled, projected expert
  ``phi_i`` is modulated by the others, ``phi_i * sigmoid(h(sum_{j != i} g(phi_i,
  phi_j)))`` with ``g``, ``h`` small MLPs and ``j`` over the experts the video has,
  then mapped by its own gated embedding unit (Miech et al. 2018:
  ``normalize(z * sigmoid(W z + b))``, ``z = W' x + b'``) to a unit vector. The text
  side has one gated embedding unit per expert and mixture weights (a softmax over
  the experts from the sentence vector); the score is
  ``sum_i w_i(text) present_i(video) cos(text_i, video_i)``: an absent expert adds 0
  and the weights are not renormalised (the default), so every score is a dot product
  of one text and one video vector. With ``renormalize_weights`` the score is
  collaborative experts' (``sharded_cross_view_inner_product`` of its model/model.py):
  the weights are masked by the video's experts and divided by their sum over them,
  ``sum_i w_i p_i cos_i / sum_j w_j p_j``. That ratio depends on the pair, so each
  embedding then carries its m weights (text) or m availabilities (video, 0 or 1) in
  m extra last columns and :meth:`RetrievalModel.similarity` (:func:`renormalized_scores`)
  scores a pair as the ratio of two dot products.
* ``"gating+man"``: MAN appendix H.2, the representation of collaborative gating with
  MAN's unit vector concatenated; on the text side MAN's vector is one more expert of
  the mixture. ``"mean+man"``: the mean of experts' unit vector beside MAN's vector. In
  both MAN's fused vector is layer-normalised before its output map (its value, a
  product over the experts, is otherwise ~10x smaller than the map's bias at
  initialisation and every video starts with the same direction).
* MAN's branch starting at zero (``man_zero_init``, the default of ``"mean+man"``): the
  output map of MAN's branch is zero-initialised and its vector is not L2-normalised,
  so the score is ``cos(A t, mean of experts) + <unit(B t), W_o LN(MAN(video)) + b_o>``
  with ``W_o``, ``b_o`` zero at the start: the model starts as the mean of experts and
  MAN's share of the score is learned from zero, as a zero-initialised residual branch
  (ReZero, Bachlechner et al. 2021; the zero-initialised last layer of each residual
  block, Goyal et al. 2017). With ``man_zero_init=False`` (the layout before) both
  halves are unit vectors divided by sqrt(2), the score the mean of the two cosines.
  Why (measured on MSVD, docs/RETRIEVAL.md, "Mean + MAN"): trained that way, MAN's half
  ranks held-out videos at chance, while its scores spread more than half as much as
  the mean's; the equal weighting adds that noise to every score.

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

import math
from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor, nn

from polyfuse import nn as pnn
from polyfuse.functional.pooling import masked_mean

__all__ = [
    "VIDEO_FUSIONS", "CollaborativeGating", "ExpertTextHead", "ExpertVideoEncoder", "GatedEmbeddingUnit",
    "RetrievalModel", "renormalized_scores",
]

VIDEO_FUSIONS = ("man", "concat", "mean", "gating", "gating+man", "mean+man")


def renormalized_scores(texts: Tensor, videos: Tensor, experts: int) -> Tensor:
    """(Q, G) collaborative experts' scores with the mixture weights renormalised over the
    experts each video has: ``(t . v) / (w . p)``.

    ``texts`` (Q, E + experts): the mixture-weighted per-expert text vectors, then the
    weights w; ``videos`` (G, E + experts): the per-expert video vectors (zero where
    absent), then the availabilities p (0 or 1). ``t . v = sum_i w_i p_i cos_i``; the
    softmax weights are positive and every video has an expert, so ``w . p > 0``.
    """
    numerator = texts[:, :-experts] @ videos[:, :-experts].T
    return numerator / (texts[:, -experts:] @ videos[:, -experts:].T)


class GatedEmbeddingUnit(nn.Module):
    """(..., d_in) -> (..., D) unit vectors: ``normalize(z * sigmoid(W z + b))``, ``z = W' x + b'``
    (Miech, Laptev and Sivic 2018, the unit collaborative experts uses per expert)."""

    def __init__(self, input_dim: int, embed_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_dim, embed_dim)
        self.gate = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        z = self.linear(x)
        return nn.functional.normalize(z * torch.sigmoid(self.gate(z)), dim=-1)


class CollaborativeGating(nn.Module):
    """Experts -> (B, m * D): per expert a unit vector, zero for an absent expert.

    ``phi_i = W_i masked_mean(x_i)``; ``T_i = h(sum_{j != i, j present} g([phi_i, phi_j]))``;
    the expert's embedding is ``GEU_i(phi_i * sigmoid(T_i))`` (collaborative experts,
    section 3). ``g`` (:attr:`pair_relation`, the relation of expert i to expert j) and
    ``h`` (:attr:`attention`, the summed relations to the attention vector T_i):
    two-layer MLPs (Linear(2D or D, D), ReLU, Linear(D, D)).
    """

    def __init__(self, expert_dims: Sequence[int], embed_dim: int) -> None:
        super().__init__()
        self.projections = nn.ModuleList(nn.Linear(d, embed_dim) for d in expert_dims)
        self.pair_relation = nn.Sequential(  # g
            nn.Linear(2 * embed_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, embed_dim)
        )
        self.attention = nn.Sequential(  # h
            nn.Linear(embed_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, embed_dim)
        )
        self.units = nn.ModuleList(GatedEmbeddingUnit(embed_dim, embed_dim) for _ in expert_dims)

    def forward(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        phi = torch.stack(
            [proj(masked_mean(x, m)) for proj, x, m in zip(self.projections, features, masks, strict=True)], dim=1
        )  # (B, m, D)
        count = phi.shape[1]
        pairs = torch.cat(torch.broadcast_tensors(phi.unsqueeze(2), phi.unsqueeze(1)), dim=-1)  # (B, m, m, 2D)
        relations = self.pair_relation(pairs)  # (B, m, m, D): g(phi_i, phi_j)
        others = present.unsqueeze(1) & ~torch.eye(count, dtype=torch.bool, device=phi.device)  # (B, m, m): j present, j != i
        attention = self.attention((relations * others.unsqueeze(-1).to(relations.dtype)).sum(dim=2))  # (B, m, D): T_i
        gated = phi * torch.sigmoid(attention)
        embedded = torch.stack([unit(gated[:, i]) for i, unit in enumerate(self.units)], dim=1)  # (B, m, D)
        return (embedded * present.unsqueeze(-1).to(embedded.dtype)).flatten(1)


class ExpertTextHead(nn.Module):
    """(B, d_t) sentence vectors -> (B, m * D): per expert ``w_i(t) GEU_i(t)``, with
    mixture weights ``w = softmax(W t + b)`` over the m experts (collaborative experts)."""

    def __init__(self, text_dim: int, experts: int, embed_dim: int) -> None:
        super().__init__()
        self.units = nn.ModuleList(GatedEmbeddingUnit(text_dim, embed_dim) for _ in range(experts))
        self.mixture = nn.Linear(text_dim, experts)

    def forward(self, sentences: Tensor, *, with_weights: bool = False) -> Tensor:
        """(B, m * D); with ``with_weights`` (B, m * D + m), the weights w appended."""
        weights = torch.softmax(self.mixture(sentences), dim=-1)  # (B, m)
        embedded = torch.stack([unit(sentences) for unit in self.units], dim=1)  # (B, m, D)
        out = (embedded * weights.unsqueeze(-1)).flatten(1)
        return torch.cat((out, weights), -1) if with_weights else out


class ExpertVideoEncoder(nn.Module):
    """Experts -> one (B, D) unit vector per video.

    Args:
        expert_dims: d_j of each expert, in order.
        embed_dim: D.
        fusion: one of ``VIDEO_FUSIONS``.
        hidden_dim: hidden size of MAN / Concat.
        fusion_options: extra keyword arguments of the fusion module (e.g. MAN's heads).
        man_layer_norm: layer-normalise MAN's fused vector before its output map (None:
            on for ``gating+man`` and ``mean+man``, off for ``man``).
        man_zero_init: ``mean+man`` only: MAN's branch starts at zero (its output map
            zero-initialised, its vector not L2-normalised). Needs the layer norm; None: on
            where the layer norm is.
    """

    def __init__(
        self,
        expert_dims: Sequence[int],
        embed_dim: int,
        *,
        fusion: str = "man",
        hidden_dim: int = 64,
        fusion_options: dict | None = None,
        man_layer_norm: bool | None = None,
        man_zero_init: bool | None = None,
    ) -> None:
        super().__init__()
        if fusion not in VIDEO_FUSIONS:
            raise ValueError(f"unknown video fusion {fusion!r}; available: {', '.join(VIDEO_FUSIONS)}")
        self.expert_dims = [int(d) for d in expert_dims]
        self.fusion_name = fusion
        base, _, joint = fusion.partition("+")  # "gating+man": CE's representation and MAN's
        # None: on where MAN is a branch beside an additive one (gating+man, mean+man), off
        # for MAN alone (measured on MSVD: docs/RETRIEVAL.md, "MAN alone on MSVD")
        self.man_layer_norm = bool(joint) if man_layer_norm is None else man_layer_norm
        # None: on for mean+man with MAN's layer norm (the map it zero-initialises follows the norm)
        self.man_zero_init = (fusion == "mean+man" and self.man_layer_norm) if man_zero_init is None \
            else bool(man_zero_init)
        if self.man_zero_init and fusion != "mean+man":
            raise ValueError(f"man_zero_init applies to the fusion mean+man only, not {fusion}")
        if self.man_zero_init and not self.man_layer_norm:
            raise ValueError("man_zero_init needs man_layer_norm: the map it zero-initialises is the one "
                             "after MAN's layer norm")
        if base != "mean" and len(self.expert_dims) < 2:
            raise ValueError(f"{fusion} fuses at least 2 experts, got {len(self.expert_dims)}")
        if base == "mean":
            self.projections = nn.ModuleList(nn.Linear(d, embed_dim) for d in self.expert_dims)
        elif base == "gating":
            self.gating = CollaborativeGating(self.expert_dims, embed_dim)
        if base in ("man", "concat") or joint == "man":
            self.absent = nn.ParameterList(nn.Parameter(torch.zeros(d)) for d in self.expert_dims)
            name = "man" if joint else base
            if name == "man" and self.man_layer_norm:
                # MAN's multilinear value (a product over the experts of projected steps) is
                # ~10x smaller than an output bias at initialisation: layer-normalise it
                # first (docs/RETRIEVAL.md, "Why MAN alone was unstable").
                self.fusion = pnn.create(
                    name, input_dims=self.expert_dims, out_dim=hidden_dim, hidden_dim=hidden_dim,
                    **(fusion_options or {}),
                )
                self.fused_output = nn.Sequential(nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, embed_dim))
                if self.man_zero_init:  # MAN's branch starts at zero (after the default init drew its numbers)
                    nn.init.zeros_(self.fused_output[1].weight)
                    nn.init.zeros_(self.fused_output[1].bias)
            else:
                self.fusion = pnn.create(
                    name, input_dims=self.expert_dims, out_dim=embed_dim, hidden_dim=hidden_dim,
                    **(fusion_options or {}),
                )
                self.fused_output = nn.Identity()

    def forward(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        """Args: ``features`` m tensors (B, T_j, d_j); ``masks`` m (B, T_j) bool;
        ``present`` (B, m) bool. Returns (B, D), L2-normalised; for ``gating``
        (B, m * D), one unit vector per expert the video has (zeros for the others);
        for ``gating+man`` (B, (m + 1) * D), those and MAN's unit vector; for
        ``mean+man`` (B, 2 D), the unit vector of the mean of experts and MAN's vector
        (with ``man_zero_init`` MAN's output as it is, zero at initialisation; without,
        MAN's unit vector, and both halves divided by sqrt(2))."""
        if len(features) != len(self.expert_dims) or len(masks) != len(features):
            raise ValueError(f"expected {len(self.expert_dims)} experts, got {len(features)}")
        if present.shape != (features[0].shape[0], len(features)):
            raise ValueError(f"present has shape {tuple(present.shape)}, expected (B, {len(features)})")
        if not bool(present.any(dim=1).all()):
            raise ValueError("a video of the batch has no expert at all")
        if self.fusion_name == "gating":
            return self._gating(features, masks, present)
        if self.fusion_name == "mean":
            return nn.functional.normalize(self._mean(features, masks, present), dim=-1)
        if self.fusion_name == "gating+man":  # MAN appendix H.2: concatenated with CE's
            return torch.cat((self._gating(features, masks, present), self._joint(features, masks, present)), -1)
        if self.fusion_name == "mean+man":
            mean = nn.functional.normalize(self._mean(features, masks, present), dim=-1)
            if self.man_zero_init:  # MAN's share of the score is learned from zero
                return torch.cat((mean, self._joint(features, masks, present, unit=False)), -1)
            return torch.cat((mean, self._joint(features, masks, present)), -1) / math.sqrt(2)
        return self._joint(features, masks, present)

    def _gating(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        masks = [m & present[:, j].unsqueeze(1) for j, m in enumerate(masks)]  # an absent expert is never read
        return self.gating(features, masks, present)

    def _mean(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        pooled = torch.stack(
            [proj(masked_mean(x, m)) for proj, x, m in zip(self.projections, features, masks, strict=True)],
            dim=1,
        )  # (B, m, D)
        weights = present.to(pooled.dtype).unsqueeze(-1)
        return (pooled * weights).sum(1) / weights.sum(1)

    def _joint(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor, *,
               unit: bool = True) -> Tensor:
        """MAN or Concat over all experts, an absent expert as its learned absent step:
        (B, D), L2-normalised when ``unit``."""
        fused = self.fused_output(self.fusion(*self.joint_inputs(features, masks, present)))
        return nn.functional.normalize(fused, dim=-1) if unit else fused

    def joint_inputs(self, features: Sequence[Tensor], masks: Sequence[Tensor],
                     present: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The inputs of the joint fusion: each expert (B, 1 + T_j, d_j), its learned absent
        step first, real only where the expert is absent (its own steps then never read)."""
        inputs, input_masks = [], []
        for j, (x, m) in enumerate(zip(features, masks, strict=True)):
            here = present[:, j]
            absent_step = self.absent[j].to(x.dtype).expand(x.shape[0], 1, -1)
            inputs.append(torch.cat((absent_step, x), dim=1))
            input_masks.append(torch.cat(((~here).unsqueeze(1), m & here.unsqueeze(1)), dim=1))
        return inputs, input_masks


class RetrievalModel(nn.Module):
    """A text head and a video encoder into one cosine space.

    Args:
        text_dim: d_t of the sentence vectors. expert_dims, embed_dim, fusion,
        hidden_dim, fusion_options, man_layer_norm, man_zero_init: of :class:`ExpertVideoEncoder`.
        renormalize_weights: ``gating``, ``gating+man`` only: renormalise the mixture
            weights over the experts each video has (collaborative experts; module
            docstring). The embeddings then carry m (``gating+man``: m + 1, MAN's vector
            always present) extra columns and must be scored by :meth:`similarity`.

    Text side: ``gating`` has CE's expert text head over the m experts, ``gating+man``
    over m + 1 (MAN's vector is one more expert, with its own gated embedding unit and
    mixture weight), ``mean+man`` two linear maps, each to a unit vector, concatenated
    (the score is the mean branch's cosine plus MAN's learned share; without
    ``man_zero_init``, divided by sqrt(2): the mean of the two cosines, both branches
    weighed equally); the others one linear map to a unit vector.
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
        man_layer_norm: bool | None = None,
        man_zero_init: bool | None = None,
        renormalize_weights: bool = False,
    ) -> None:
        super().__init__()
        self.gating = fusion in ("gating", "gating+man")
        if renormalize_weights and not self.gating:
            raise ValueError(f"renormalize_weights applies to the mixture weights of gating and gating+man, not {fusion}")
        self.renormalize_weights = bool(renormalize_weights)
        self.mixture_experts = len(expert_dims) + (fusion == "gating+man")  # m; gating+man: MAN's vector too
        self.branches = 2 if fusion == "mean+man" else 1
        self.text_head = (
            ExpertTextHead(text_dim, self.mixture_experts, embed_dim)
            if self.gating
            else nn.Linear(text_dim, self.branches * embed_dim)
        )
        self.video = ExpertVideoEncoder(
            expert_dims, embed_dim, fusion=fusion, hidden_dim=hidden_dim, fusion_options=fusion_options,
            man_layer_norm=man_layer_norm, man_zero_init=man_zero_init,
        )
        # the text halves are divided by sqrt(2) only where the video halves are
        self.text_scale = 1.0 if self.video.man_zero_init else 1 / math.sqrt(self.branches)

    def embed_texts(self, sentence_vectors: Tensor) -> Tensor:
        """(B, d_t) -> (B, D) unit vectors; for ``gating`` (B, m * D), the mixture-weighted
        per-expert unit vectors, so that a dot product with a video is CE's score
        (``gating+man``: (B, (m + 1) D)); for ``mean+man`` (B, 2 D), two unit vectors
        (each divided by sqrt(2) without ``man_zero_init``)."""
        if self.gating:  # renormalize_weights: the weights in m extra columns
            return self.text_head(sentence_vectors, with_weights=self.renormalize_weights)
        branches = self.text_head(sentence_vectors).unflatten(-1, (self.branches, -1))
        return nn.functional.normalize(branches, dim=-1).flatten(-2) * self.text_scale

    def embed_videos(self, features: Sequence[Tensor], masks: Sequence[Tensor], present: Tensor) -> Tensor:
        """(B, D) as :meth:`ExpertVideoEncoder.forward`; with ``renormalize_weights`` the
        availabilities (0 or 1, MAN's vector always 1) in m extra last columns."""
        videos = self.video(features, masks, present)
        if not self.renormalize_weights:
            return videos
        available = present.to(videos.dtype)
        if self.mixture_experts > available.shape[1]:  # gating+man: MAN's vector, always there
            available = torch.cat((available, available.new_ones(available.shape[0], 1)), -1)
        return torch.cat((videos, available), -1)

    def similarity(self, texts: Tensor, videos: Tensor) -> Tensor:
        """(Q, G) scores of ``texts`` (Q, ...) against ``videos`` (G, ...) from
        :meth:`embed_texts` and :meth:`embed_videos`: their dot products, or with
        ``renormalize_weights`` :func:`renormalized_scores`."""
        scores = self.score_function()
        return texts @ videos.T if scores is None else scores(texts, videos)

    def score_function(self):
        """The scorer of :meth:`similarity` as a picklable function of (queries, gallery)
        for :mod:`polyfuse.metrics.retrieval`; None for plain dot products."""
        if self.renormalize_weights:
            return partial(renormalized_scores, experts=self.mixture_experts)
        return None
