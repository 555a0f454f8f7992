"""Chimera (sec. 3) between a frozen text encoder and video features, for retrieval.

Shapes: ``B_t`` captions, ``B_v`` videos, ``N_t`` word pieces, ``N_v`` video steps
("regions"), ``d`` the text encoder's hidden size (384 for MiniLM), ``d_v`` the video
feature size, ``Z`` topics, ``n`` hyperbolic dimension.

H_L(text) are the encoder's last hidden states; H_L(image) are the video steps mapped
to size d by a linear layer (the "image encoder" here: frozen VGG rows plus one
trained projection). Per Figure 1, the text and image topic layers see their own
modality and the hyperbolic layer attends over the joint sequence [text; image], so
the matching layer's H_M belongs to one (caption, video) pair (a cross-encoder, like
the ITM heads the paper builds on). The score of a pair is a linear head on the product
of H_M's mean over the text positions and its mean over the video positions,
w . (m_text * m_video), without a bias: a constant would shift every score alike, which
no ranking loss sees (its gradient is rounding noise, which Adam turns into drift). A linear head on the mean over all positions would be
additive, a(caption) + b(video), outside what the hyperbolic attention mixes, and so
rank the videos nearly alike for every caption (our first runs stayed at chance); the
product makes every dimension of H_M a caption-video interaction. The paper scores with
its pre-trained model's own matching head, which this setting does not have. The topic
layers run once per caption and once per video; only the hyperbolic and matching
layers run per pair.

Word and region points for HLM and L_D (Eq. 11, 12) are the per-token value vectors
of the hyperbolic layer, clipped, and their exponential maps (the per-token form of
:meth:`polyfuse.nn.HyperbolicLayer.embed`), each modality on its own.

Ablations (Table 4): ``num_topics=0`` drops the topic layers (H_T = H_L, the residual
variant); ``hyperbolic_dim=0`` drops the hyperbolic layer (H_h = H_L).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from polyfuse.functional.chimera_losses import topic_lm_loss
from polyfuse.functional.lorentz import clip_radius, lorentz_expmap0
from polyfuse.functional.pooling import masked_mean
from polyfuse.nn.chimera import HyperbolicLayer, MatchingLayer, TopicLayer

__all__ = ["ChimeraRetrievalModel", "ChimeraSides"]


class ChimeraSides(NamedTuple):
    """Per-modality results: topic-layer states (B, N, d) and mean topic distribution
    (B, Z) (None without topics); word/region points (B, N, n + 1) and tangents (B, N, n)
    (None without the hyperbolic layer); the inputs H_L (B, N, d) and masks; the
    per-token topic prior logits (B, N, Z) of Eq. 4 (None without topics)."""

    hidden: Tensor
    mask: Tensor
    topic_hidden: Tensor
    topics: Tensor | None
    points: Tensor | None
    tangents: Tensor | None
    topic_logits: Tensor | None = None


class ChimeraRetrievalModel(nn.Module):
    """Topic layers, hyperbolic layer and matching layer over (caption, video) pairs.

    Args:
        text_dim: d. video_dim: d_v.
        num_topics: Z (0: no topic layer). topic_variant: "affine", "addition", "multiplication".
        hyperbolic_dim: n (0: no hyperbolic layer).
    """

    def __init__(
        self,
        text_dim: int,
        video_dim: int,
        *,
        num_topics: int = 20,
        topic_variant: str = "affine",
        hyperbolic_dim: int = 20,
    ) -> None:
        super().__init__()
        self.video_projection = nn.Linear(video_dim, text_dim)
        self.use_topics = num_topics > 0
        self.use_hyperbolic = hyperbolic_dim > 0
        if self.use_topics:
            self.text_topic = TopicLayer(text_dim, num_topics, variant=topic_variant)
            self.image_topic = TopicLayer(text_dim, num_topics, variant=topic_variant)
        if self.use_hyperbolic:
            self.hyperbolic = HyperbolicLayer(text_dim, hyperbolic_dim)
        self.matching = MatchingLayer()
        self.score_head = nn.Linear(text_dim, 1, bias=False)  # no bias: see the module docstring

    def _side(self, hidden: Tensor, mask: Tensor, topic: str) -> ChimeraSides:
        topics = topic_logits = None
        topic_hidden = hidden
        if self.use_topics:
            out = getattr(self, topic)(hidden, mask)
            topic_hidden, topics = out.hidden, masked_mean(out.topic_probs, mask)
            topic_logits = out.topic_logits
        points = tangents = None
        if self.use_hyperbolic:
            tangents = clip_radius(self.hyperbolic.value(hidden), self.hyperbolic.max_radius)
            tangents = tangents.masked_fill(~mask.unsqueeze(-1), 0.0)
            points = lorentz_expmap0(tangents, max_radius=self.hyperbolic.max_radius)
        return ChimeraSides(hidden, mask, topic_hidden, topics, points, tangents, topic_logits)

    def texts(self, tokens: Tensor, mask: Tensor) -> ChimeraSides:
        """(B_t, N_t, d) encoder states and (B_t, N_t) mask -> the text side."""
        return self._side(tokens.masked_fill(~mask.unsqueeze(-1), 0.0), mask, "text_topic")

    def videos(self, steps: Tensor, mask: Tensor) -> ChimeraSides:
        """(B_v, N_v, d_v) video steps and (B_v, N_v) mask -> the image side."""
        hidden = self.video_projection(steps).masked_fill(~mask.unsqueeze(-1), 0.0)
        return self._side(hidden, mask, "image_topic")

    def topic_lm_loss(self, text: ChimeraSides, token_ids: Tensor, masked: Tensor, lm_head: nn.Module) -> Tensor:
        """L_T (Eq. 3) of the text topic layer at the masked word pieces, mean over them.

        The encoder read the caption with the word pieces at ``masked`` replaced by
        [MASK], so its state h_{L,t} there sees x_\\t only. At each masked position t,

            L_T = - log sum_z P(x_t | x_\\t, z) P(z | x_\\t)
            P(z | x_\\t) = softmax_z(LayerNorm(h_{L,t}) W_Z)              (Eq. 4)
            P(. | x_\\t, z) = softmax(W_{V|Z} T_z(h_{L,t}))                 (Eq. 5)

        with T_z the topic transforms (T_0 the identity) and W_{V|Z} = ``lm_head``. Word
        logits are computed for the M masked positions only: (M, Z, V), never (B, N, Z, V).

        Args:
            text: the text side of :meth:`texts` (of the masked captions).
            token_ids: (B, N) int64, the original word-piece ids (the targets).
            masked: (B, N) bool, True at the masked word pieces (all real tokens).
            lm_head: (..., d) -> (..., V), e.g. :class:`polyfuse.nn.chimera.TiedMaskedLMHead`.

        Returns:
            Scalar loss (0 with a zero gradient when nothing is masked).
        """
        if not self.use_topics:
            raise ValueError("topic_lm_loss needs the topic layers (num_topics > 0)")
        if not isinstance(masked, Tensor) or masked.dtype != torch.bool or masked.shape != text.mask.shape:
            raise ValueError(f"masked must be a bool tensor of shape {tuple(text.mask.shape)}")
        if bool((masked & ~text.mask).any()):
            raise ValueError("masked marks a padded position; only real tokens can be masked")
        if not isinstance(token_ids, Tensor) or token_ids.shape != masked.shape:
            raise ValueError(f"token_ids must be a tensor of shape {tuple(masked.shape)}")
        if not bool(masked.any()):
            return text.topic_hidden.sum() * 0.0
        hidden = text.hidden[masked]  # h_{L,t} at the masked positions, (M, d)
        states = self.text_topic.topic_states(hidden.unsqueeze(0)).squeeze(0)  # T_z(h), (M, Z, d)
        word_logits = lm_head(states)  # W_{V|Z} T_z(h), (M, Z, V)
        return topic_lm_loss(word_logits, text.topic_logits[masked], token_ids[masked].long())  # Eq. 3

    def pair_scores(self, text: ChimeraSides, video: ChimeraSides, pairs: Tensor) -> Tensor:
        """Scores of the (caption, video) index pairs ``pairs`` (P, 2) -> (P,)."""
        t, v = pairs[:, 0], pairs[:, 1]
        joint = torch.cat((text.hidden[t], video.hidden[v]), dim=1)  # H_L, (P, N_t + N_v, d)
        mask = torch.cat((text.mask[t], video.mask[v]), dim=1)
        hyperbolic = self.hyperbolic(joint, mask).hidden if self.use_hyperbolic else joint  # H_h
        text_topic = torch.cat((text.topic_hidden[t], torch.zeros_like(video.hidden[v])), dim=1)
        image_topic = torch.cat((torch.zeros_like(text.hidden[t]), video.topic_hidden[v]), dim=1)
        fused = self.matching(hyperbolic, text_topic, image_topic)  # Eq. 9, H_M
        length = text.hidden.shape[1]
        text_mean = masked_mean(fused[:, :length], text.mask[t])
        video_mean = masked_mean(fused[:, length:], video.mask[v])
        return self.score_head(text_mean * video_mean).squeeze(-1)  # w . (m_text * m_video)

    def score_matrix(self, text: ChimeraSides, video: ChimeraSides, chunk: int = 2048) -> Tensor:
        """(B_t, B_v) scores of every caption against every video, in chunks of pairs."""
        grid = torch.cartesian_prod(torch.arange(text.hidden.shape[0]), torch.arange(video.hidden.shape[0]))
        scores = torch.cat([self.pair_scores(text, video, grid[s : s + chunk]) for s in range(0, len(grid), chunk)])
        return scores.view(text.hidden.shape[0], video.hidden.shape[0])
