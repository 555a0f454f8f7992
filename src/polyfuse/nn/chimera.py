"""Chimera's layers: topic layer, Lorentz hyperbolic layer, matching layer (Chimera sec. 3).

Shapes: ``B`` batch, ``N`` tokens (``N_t`` text, ``N_v`` image), ``d`` hidden size of
the encoder (d_h in the paper), ``Z`` topics, ``n`` hyperbolic dimension (points
have n + 1 coordinates).

Chimera sits on the last hidden states H_L of a pre-trained encoder, on the text side
and on the image side, and returns hidden states of the same size (Figure 1). These
modules are not fusion modules of the common registry interface (they map hidden
states to hidden states), so they are not registered. Masks are (B, N) bool with
True at real tokens; padded tokens change nothing, and outputs at padded positions
are zero (the origin for hyperboloid points).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from polyfuse._checks import check_finite, check_mask
from polyfuse._precision import float32_call, needs_float32, widen_under_autocast
from polyfuse.functional.lorentz import (
    clip_radius,
    lorentz_attention,
    lorentz_expmap0,
    lorentz_logmap0,
)
from polyfuse.functional.pooling import masked_mean

__all__ = [
    "TOPIC_VARIANTS",
    "Chimera",
    "ChimeraOutput",
    "HyperbolicLayer",
    "HyperbolicLayerOutput",
    "MatchingLayer",
    "TiedMaskedLMHead",
    "TopicLayer",
    "TopicLayerOutput",
]

TOPIC_VARIANTS = ("residual", "addition", "multiplication", "affine")


def _prepare_hidden(
    hidden: object, mask: object, hidden_size: int, name: str, mask_name: str
) -> tuple[Tensor, Tensor]:
    """Check (B, N, d) hidden states and their (B, N) mask; zero the padded tokens."""
    if not isinstance(hidden, Tensor) or not hidden.is_floating_point():
        raise ValueError(f"{name} must be a float tensor of shape (B, N, {hidden_size})")
    if hidden.dim() != 3 or hidden.shape[-1] != hidden_size or hidden.shape[1] == 0:
        raise ValueError(
            f"{name} has shape {tuple(hidden.shape)}, expected (B, N, {hidden_size}) with N >= 1"
        )
    if mask is None:
        mask = torch.ones(hidden.shape[:-1], dtype=torch.bool, device=hidden.device)
    else:
        mask = check_mask(mask, hidden.shape[:-1], mask_name)
    check_finite(hidden, name, mask)
    return hidden.masked_fill(~mask.unsqueeze(-1), 0.0), mask


def _logit(probability: float, name: str) -> float:
    if not 0.0 < probability < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {probability}")
    return math.log(probability / (1.0 - probability))


# -------------------------------------------------------------------------- topics


class TopicLayerOutput(NamedTuple):
    """``hidden`` (B, N, d) H_T; ``topic_logits`` and ``topic_probs`` (B, N, Z), the
    prior P(z_t | x) of Eq. 4 as logits and as probabilities (zero at padded tokens)."""

    hidden: Tensor
    topic_logits: Tensor
    topic_probs: Tensor


class TopicLayer(nn.Module):
    """Topic layer (Chimera Eq. 4 and 5): a mixture of Z topic-specific transforms.

    Our reading of Eq. 4 and 5. The topic prior of token t is

        P(z_t | x) = softmax_z(LayerNorm(h_t) W_Z),        W_Z in R^{d x Z}   (Eq. 4)

    (the softmax makes the "multinomial distribution" of sec. 3.3). Topic z transforms
    the token's hidden state h_t (Eq. 5 without W_{V|Z}):

        T_0(h) = h                                   residual: topic 0 keeps the Euclidean input
        T_z(h) = (1 - omega) h + omega g_z           addition (z > 0)
        T_z(h) = h o g_z                             multiplication (z > 0, elementwise)
        T_z(h) = h W_{R|z} + b_z                     affine (z > 0)

    The "x" of Eq. 4 is the marginalisation over z, so the layer returns
    H_T = sum_z P(z_t | x) T_z(h_t), of hidden size d; the word distribution of topic z
    is F_z = W_{V|Z} T_z(h) (the encoder's vocabulary head applied to
    :meth:`topic_states`), which :func:`polyfuse.functional.topic_lm_loss` mixes
    with the prior (Eq. 3). ``variant="residual"`` makes every topic the identity
    (H_T = h, the no-topic ablation of Table 4), while the prior is still learned.

    Parameters: omega is one learnable scalar in (0, 1) (a sigmoid of a logit,
    initially 0.5); g_z starts at N(0, init_std^2) for addition and 1 + N(0, init_std^2)
    for multiplication; W_{R|z} starts at I + N(0, init_std^2) and b_z at 0, so that
    multiplication and affine start close to the identity (plugging the layer into a
    pre-trained model then barely changes it) while the noise separates the topics.

    Args:
        hidden_size: d.
        num_topics: Z >= 1, counting the residual topic 0 (Table 4's best: 20).
        variant: one of ``TOPIC_VARIANTS`` (Table 4's best: ``"affine"``).
        init_std: scale of the initial noise.
        layer_norm_eps: eps of the LayerNorm of Eq. 4.
    """

    def __init__(
        self,
        hidden_size: int,
        num_topics: int = 20,
        *,
        variant: str = "affine",
        init_std: float = 0.02,
        layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if hidden_size <= 0 or num_topics <= 0:
            raise ValueError(
                f"hidden_size and num_topics must be positive, got {hidden_size} and {num_topics}"
            )
        if variant not in TOPIC_VARIANTS:
            raise ValueError(f"unknown topic variant {variant!r}; available: {', '.join(TOPIC_VARIANTS)}")
        self.hidden_size = int(hidden_size)
        self.num_topics = int(num_topics)
        self.variant = variant
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.topic_prior = nn.Linear(hidden_size, num_topics, bias=False)  # W_Z, Eq. 4
        extra = num_topics - 1  # topics z > 0
        if variant == "addition":
            self.topic_vectors = nn.Parameter(torch.randn(extra, hidden_size) * init_std)
            self.addition_logit = nn.Parameter(torch.zeros(()))
        elif variant == "multiplication":
            self.topic_vectors = nn.Parameter(1.0 + torch.randn(extra, hidden_size) * init_std)
        elif variant == "affine":
            identity = torch.eye(hidden_size).expand(extra, -1, -1)
            self.topic_weights = nn.Parameter(
                identity + torch.randn(extra, hidden_size, hidden_size) * init_std
            )
            self.topic_biases = nn.Parameter(torch.zeros(extra, hidden_size))

    @property
    def addition_weight(self) -> Tensor:
        """omega of the addition variant, in (0, 1)."""
        if self.variant != "addition":
            raise AttributeError("addition_weight exists only for variant='addition'")
        return torch.sigmoid(self.addition_logit)

    def _transformed(self, hidden: Tensor) -> Tensor | None:
        """T_z(h) for z > 0, (..., Z - 1, d); None for the residual variant."""
        h = hidden.unsqueeze(-2)
        if self.variant == "addition":
            omega = self.addition_weight
            return (1.0 - omega) * h + omega * self.topic_vectors  # Eq. 5, addition
        if self.variant == "multiplication":
            return h * self.topic_vectors  # Eq. 5, multiplication
        if self.variant == "affine":
            transformed = torch.einsum("...d,zde->...ze", hidden, self.topic_weights)
            return transformed + self.topic_biases  # Eq. 5, affine
        return None

    def topic_states(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """T_z(h) for every topic, the states W_{V|Z} turns into word logits (Eq. 5).

        Args:
            hidden: (B, N, d) hidden states H_L.
            mask: (B, N) bool or None; padded tokens get zero states.

        Returns:
            (B, N, Z, d); index 0 is the residual topic (h itself).
        """
        hidden, mask = _prepare_hidden(hidden, mask, self.hidden_size, "hidden", "mask")
        transformed = self._transformed(hidden)
        if transformed is None:
            return hidden.unsqueeze(-2).expand(*hidden.shape[:-1], self.num_topics, -1)
        states = torch.cat((hidden.unsqueeze(-2), transformed), dim=-2)
        return states.masked_fill(~mask[..., None, None], 0.0)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> TopicLayerOutput:
        """Args: ``hidden`` (B, N, d) H_L of one modality; ``mask`` (B, N) bool or None."""
        hidden, mask = _prepare_hidden(hidden, mask, self.hidden_size, "hidden", "mask")
        # Eq. 4; under autocast the LayerNorm and the softmax compute in float32
        topic_logits = self.topic_prior(self.norm(widen_under_autocast(hidden)))
        topic_probs = torch.softmax(widen_under_autocast(topic_logits), dim=-1)
        residual_prob = topic_probs[..., :1]
        other_probs = topic_probs[..., 1:]
        # H_T = sum_z P(z) T_z(h), without materialising all T_z(h) where avoidable
        if self.variant == "residual":
            mixed = hidden
        elif self.variant == "addition":
            omega = self.addition_weight
            mixed = (
                residual_prob * hidden
                + (1.0 - residual_prob) * (1.0 - omega) * hidden
                + omega * (other_probs @ self.topic_vectors)
            )
        elif self.variant == "multiplication":
            mixed = residual_prob * hidden + hidden * (other_probs @ self.topic_vectors)
        else:
            transformed = self._transformed(hidden)
            mixed = residual_prob * hidden + torch.einsum("...z,...zd->...d", other_probs, transformed)
        padded = ~mask.unsqueeze(-1)
        return TopicLayerOutput(
            hidden=mixed.masked_fill(padded, 0.0),
            topic_logits=topic_logits.masked_fill(padded, 0.0),
            topic_probs=topic_probs.masked_fill(padded, 0.0),
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, num_topics={self.num_topics}, variant={self.variant!r}"


class TiedMaskedLMHead(nn.Module):
    """BERT's masked-LM head with the decoder tied to the word embeddings: W_{V|Z} of Eq. 5.

        logits(h) = LayerNorm(GELU(h W_1 + b_1)) E^T + b_V          (B, ..., d) -> (B, ..., V)

    ``E`` is the encoder's (V, d) word-embedding matrix itself (the same Parameter, no
    copy: ``decoder_weight is word_embeddings``), so the head adds only W_1, b_1, the
    LayerNorm and b_V (d^2 + 3d + V parameters: 0.18 M for MiniLM's d = 384, V = 30,522).
    Apply it only to the states of masked tokens: over a whole batch the (..., V) logits
    are large (V = 30,522 floats per position and topic).

    Args:
        word_embeddings: the (V, d) embedding Parameter to tie to.
        layer_norm_eps: eps of the LayerNorm (BERT's 1e-12).
    """

    def __init__(self, word_embeddings: nn.Parameter, *, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        if not isinstance(word_embeddings, nn.Parameter) or word_embeddings.dim() != 2:
            raise ValueError("word_embeddings must be a (V, d) nn.Parameter (the encoder's own, to tie to)")
        vocab_size, hidden_size = word_embeddings.shape
        self.hidden_size, self.vocab_size = int(hidden_size), int(vocab_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder_weight = word_embeddings  # tied: registered here, owned by the encoder
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def own_state(self) -> dict[str, Tensor]:
        """The head's own tensors (everything but the tied embedding), for a cache file."""
        return {k: v for k, v in self.state_dict().items() if k != "decoder_weight"}

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters the head adds (not the tied embedding)."""
        return [p for name, p in self.named_parameters() if name != "decoder_weight"]

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., d) hidden states -> (..., V) word logits."""
        if not isinstance(hidden, Tensor) or hidden.shape[-1:] != (self.hidden_size,):
            raise ValueError(f"hidden must be a (..., {self.hidden_size}) tensor")
        transformed = self.norm(nn.functional.gelu(self.dense(hidden)))
        return nn.functional.linear(transformed, self.decoder_weight, self.bias)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, tied"


# ---------------------------------------------------------------------- hyperbolic


class HyperbolicLayerOutput(NamedTuple):
    """``hidden`` (B, N, d) H_h; ``points`` (B, N, n + 1) the attention results on the
    hyperboloid; ``weights`` (B, N, N) alpha of Eq. 8, or None unless requested."""

    hidden: Tensor
    points: Tensor
    weights: Tensor | None


class HyperbolicLayer(nn.Module):
    """Hyperbolic layer (Chimera sec. 3.4): Lorentz attention over the hidden states.

    Queries, keys and values are linear maps of the hidden states to R^n (the n
    "dimensions of hyperbolic space" of Table 4), placed on the hyperboloid by the
    exponential map of their polar form; :func:`~polyfuse.functional.lorentz_attention`
    (Eq. 8) aggregates the values; the log map at the origin brings the results back
    to R^n and a last linear map to the hidden size: H_h.

    beta and c are "manually set ... and learned": they start at ``beta`` and
    ``offset`` and are parameters (beta through its logarithm, so it stays positive).

    Radii are clipped at ``max_radius`` (default 10) before the exponential map: in
    float32 a point at radius r has coordinates of size e^r / 2 resolved to a relative
    6e-8, so distances are resolved to ~1e-3 at r = 10 but only to ~0.2 at r = 15.
    With the default initialisation of the projections a hidden state of norm 20
    (typical of a BERT-base last layer, d = 768) lands at radius ~2 for n = 20, well
    inside.

    Args:
        hidden_size: d.
        hyperbolic_dim: n (Table 4's best: 20).
        beta: initial beta > 0.
        offset: initial c.
        max_radius: radius cap of the exponential map.
    """

    def __init__(
        self,
        hidden_size: int,
        hyperbolic_dim: int = 20,
        *,
        beta: float = 1.0,
        offset: float = 0.0,
        max_radius: float = 10.0,
    ) -> None:
        super().__init__()
        if hidden_size <= 0 or hyperbolic_dim <= 0:
            raise ValueError(
                f"hidden_size and hyperbolic_dim must be positive, got {hidden_size} and {hyperbolic_dim}"
            )
        if not beta > 0 or not math.isfinite(beta):
            raise ValueError(f"beta must be positive and finite, got {beta}")
        if not math.isfinite(offset):
            raise ValueError(f"offset must be finite, got {offset}")
        if not max_radius > 0:
            raise ValueError(f"max_radius must be positive, got {max_radius}")
        self.hidden_size = int(hidden_size)
        self.hyperbolic_dim = int(hyperbolic_dim)
        self.max_radius = float(max_radius)
        self.query = nn.Linear(hidden_size, hyperbolic_dim)
        self.key = nn.Linear(hidden_size, hyperbolic_dim)
        self.value = nn.Linear(hidden_size, hyperbolic_dim)
        self.output = nn.Linear(hyperbolic_dim, hidden_size)
        self.log_beta = nn.Parameter(torch.tensor(math.log(beta)))
        self.offset = nn.Parameter(torch.tensor(float(offset)))

    @property
    def beta(self) -> Tensor:
        return self.log_beta.exp()

    def _points(self, projection: nn.Linear, hidden: Tensor) -> Tensor:
        return lorentz_expmap0(projection(hidden), max_radius=self.max_radius)

    def embed(self, hidden: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One point per sequence, for HLM and L_D (Eq. 11 and 12).

        The value vectors of the real tokens are averaged in R^n (the Euclidean
        feature w of sec. 3.6, clipped at ``max_radius``) and mapped to the
        hyperboloid by the exponential map of the polar form (w~).

        Args:
            hidden: (B, N, d) hidden states; mask: (B, N) bool or None.

        Returns:
            ``(points, tangents)``: (B, n + 1) w~ and (B, n) w, with points = exp_0(tangents).
        """
        hidden, mask = _prepare_hidden(hidden, mask, self.hidden_size, "hidden", "mask")
        tangents = masked_mean(clip_radius(self.value(hidden), self.max_radius), mask)
        return lorentz_expmap0(tangents, max_radius=self.max_radius), tangents

    def forward(
        self, hidden: Tensor, mask: Tensor | None = None, *, return_weights: bool = False
    ) -> HyperbolicLayerOutput:
        """Args: ``hidden`` (B, N, d); ``mask`` (B, N) bool or None (True = real token)."""
        hidden, mask = _prepare_hidden(hidden, mask, self.hidden_size, "hidden", "mask")
        points, weights = lorentz_attention(
            self._points(self.query, hidden),
            self._points(self.key, hidden),
            self._points(self.value, hidden),
            mask,
            beta=self.beta,
            offset=self.offset,
            return_weights=True,
        )
        padded = ~mask.unsqueeze(-1)
        origin = torch.zeros(points.shape[-1], dtype=points.dtype, device=points.device)
        origin[0] = 1.0
        points = torch.where(padded, origin, points)
        output = self.output(lorentz_logmap0(points)).masked_fill(padded, 0.0)
        return HyperbolicLayerOutput(output, points, weights if return_weights else None)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, hyperbolic_dim={self.hyperbolic_dim}, "
            f"max_radius={self.max_radius}"
        )


# ------------------------------------------------------------------------ matching


class MatchingLayer(nn.Module):
    """Matching layer (Chimera Eq. 9):

        H_M = (1 - omega_t) H_h + omega_t (omega_v H_T(image) + (1 - omega_v) H_T(text))

    omega_t (topic) and omega_v (visual) are learnable scalars kept in (0, 1) through a
    sigmoid of a logit, starting at ``topic_weight`` and ``visual_weight``.
    """

    def __init__(self, *, topic_weight: float = 0.5, visual_weight: float = 0.5) -> None:
        super().__init__()
        self.topic_logit = nn.Parameter(torch.tensor(_logit(topic_weight, "topic_weight")))
        self.visual_logit = nn.Parameter(torch.tensor(_logit(visual_weight, "visual_weight")))

    @property
    def topic_weight(self) -> Tensor:
        """omega_t in (0, 1)."""
        return torch.sigmoid(self.topic_logit)

    @property
    def visual_weight(self) -> Tensor:
        """omega_v in (0, 1)."""
        return torch.sigmoid(self.visual_logit)

    def forward(
        self, hyperbolic_hidden: Tensor, text_topic_hidden: Tensor, image_topic_hidden: Tensor
    ) -> Tensor:
        """All three (B, N, d) (or any equal shapes): H_h, H_T(text), H_T(image) -> H_M."""
        named = {
            "hyperbolic_hidden": hyperbolic_hidden,
            "text_topic_hidden": text_topic_hidden,
            "image_topic_hidden": image_topic_hidden,
        }
        for name, tensor in named.items():
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                raise ValueError(f"{name} must be a float tensor")
            if tensor.shape != hyperbolic_hidden.shape:
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)}, hyperbolic_hidden has "
                    f"{tuple(hyperbolic_hidden.shape)}"
                )
            check_finite(tensor, name)
        topic, visual = self.topic_weight, self.visual_weight
        topics = visual * image_topic_hidden + (1.0 - visual) * text_topic_hidden
        return (1.0 - topic) * hyperbolic_hidden + topic * topics  # Eq. 9


# ------------------------------------------------------------------------- Chimera


class ChimeraOutput(NamedTuple):
    """What :class:`Chimera` returns.

    ``hidden`` (B, N_t + N_v, d) H_M, text tokens first; ``mask`` (B, N_t + N_v);
    ``text_topic_logits`` (B, N_t, Z) and ``image_topic_logits`` (B, N_v, Z): the
    topic priors (for L_T with the topic layers' ``topic_states``); ``text_topics``
    and ``image_topics`` (B, Z): mean topic distribution over the real tokens (for
    L_TLM); ``text_points`` and ``image_points`` (B, n + 1): w~ and v~ (for L_HLM and
    L_D); ``text_tangents`` and ``image_tangents`` (B, n): w and v^ with
    points = exp_0(tangents) (for L_D).
    """

    hidden: Tensor
    mask: Tensor
    text_topic_logits: Tensor
    image_topic_logits: Tensor
    text_topics: Tensor
    image_topics: Tensor
    text_points: Tensor
    image_points: Tensor
    text_tangents: Tensor
    image_tangents: Tensor


class Chimera(nn.Module):
    """Chimera (Figure 1): text and image topic layers, a hyperbolic layer, a matching layer.

    The text (image) topic layer sees the text (image) hidden states only. The
    hyperbolic layer attends over the joint sequence H_L = [text; image] (what a
    single-stream encoder's last layer holds), so its H_h has N_t + N_v positions. In
    Eq. 9, H_T(text) is placed at the text positions and H_T(image) at the image
    positions (zero elsewhere): a text token gets (1 - omega_t) H_h + omega_t
    (1 - omega_v) H_T(text) and an image token (1 - omega_t) H_h + omega_t omega_v
    H_T(image). The sequence-level points for HLM and L_D come from each modality on
    its own (:meth:`HyperbolicLayer.embed`), so that a text and an image are compared
    without having attended to each other.

    Args:
        hidden_size: d, shared by the text and image hidden states.
        num_topics, topic_variant: of both topic layers.
        hyperbolic_dim, beta, offset, max_radius: of the hyperbolic layer.
        topic_weight, visual_weight: initial omega_t and omega_v.
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        num_topics: int = 20,
        topic_variant: str = "affine",
        hyperbolic_dim: int = 20,
        beta: float = 1.0,
        offset: float = 0.0,
        max_radius: float = 10.0,
        topic_weight: float = 0.5,
        visual_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.text_topic = TopicLayer(hidden_size, num_topics, variant=topic_variant)
        self.image_topic = TopicLayer(hidden_size, num_topics, variant=topic_variant)
        self.hyperbolic = HyperbolicLayer(
            hidden_size, hyperbolic_dim, beta=beta, offset=offset, max_radius=max_radius
        )
        self.matching = MatchingLayer(topic_weight=topic_weight, visual_weight=visual_weight)

    def forward(
        self,
        text_hidden: Tensor,
        image_hidden: Tensor,
        text_mask: Tensor | None = None,
        image_mask: Tensor | None = None,
    ) -> ChimeraOutput:
        """Args: ``text_hidden`` (B, N_t, d), ``image_hidden`` (B, N_v, d), their (B, N) masks."""
        if needs_float32(self, text_hidden, image_hidden):  # float16: computed in float32
            return float32_call(self, (text_hidden, image_hidden, text_mask, image_mask))
        d = self.hidden_size
        text_hidden, text_mask = _prepare_hidden(text_hidden, text_mask, d, "text_hidden", "text_mask")
        image_hidden, image_mask = _prepare_hidden(
            image_hidden, image_mask, d, "image_hidden", "image_mask"
        )
        if text_hidden.shape[0] != image_hidden.shape[0]:
            raise ValueError(
                f"text_hidden has batch size {text_hidden.shape[0]}, image_hidden has "
                f"{image_hidden.shape[0]}"
            )
        text_topic = self.text_topic(text_hidden, text_mask)
        image_topic = self.image_topic(image_hidden, image_mask)
        joint_hidden = torch.cat((text_hidden, image_hidden), dim=1)
        joint_mask = torch.cat((text_mask, image_mask), dim=1)
        hyperbolic = self.hyperbolic(joint_hidden, joint_mask)
        text_zeros = torch.zeros_like(text_topic.hidden)
        image_zeros = torch.zeros_like(image_topic.hidden)
        fused = self.matching(
            hyperbolic.hidden,
            torch.cat((text_topic.hidden, image_zeros), dim=1),
            torch.cat((text_zeros, image_topic.hidden), dim=1),
        )
        text_points, text_tangents = self.hyperbolic.embed(text_hidden, text_mask)
        image_points, image_tangents = self.hyperbolic.embed(image_hidden, image_mask)
        return ChimeraOutput(
            hidden=fused.masked_fill(~joint_mask.unsqueeze(-1), 0.0),
            mask=joint_mask,
            text_topic_logits=text_topic.topic_logits,
            image_topic_logits=image_topic.topic_logits,
            text_topics=masked_mean(text_topic.topic_probs, text_mask),
            image_topics=masked_mean(image_topic.topic_probs, image_mask),
            text_points=text_points,
            image_points=image_points,
            text_tangents=text_tangents,
            image_tangents=image_tangents,
        )
