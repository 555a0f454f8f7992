"""VQA models: BAN with the counting module as in ban-vqa, and any fusion with the same
question encoder and classifier.

In BAN's notation (paper section 3, sizes of section 5.4) X in R^{N x rho} is the
question (N = 1,024 GRU features, rho words) and Y in R^{M x phi} the image (M = 2,048
or any feature size, phi objects or grid cells). The reference code, and
:class:`polyfuse.nn.BAN`, take the image first (``[v, q]``) and keep the residual
stream on the question; so ``inputs[0]`` of the fusion is BAN's Y^T and ``inputs[1]``
its X^T.

Legend for shapes: ``B`` batch, ``L`` words (rho), ``O`` objects (phi), ``d_v``
image feature size, ``H`` hidden size (the GRU's and the joint representation's),
``G`` glimpses, ``A`` answers, ``K`` objects kept by the counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from polyfuse.functional.bilinear import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_attention_pooling,
)
from polyfuse.nn.ban import BAN, weight_normed_linear
from polyfuse.nn.counter import Counter
from polyfuse.nn.registry import create
from polyfuse.nn.text import QuestionEncoder

__all__ = ["BanVQA", "FusionVQA", "answer_classifier", "image_mask"]


def answer_classifier(in_dim: int, num_answers: int, *, dropout: float = 0.5) -> nn.Sequential:
    """The reference two-layer classifier: linear to 2 * in_dim, ReLU, dropout, linear to A
    (ban-vqa's ``SimpleClassifier``, weight-normalised layers)."""
    return nn.Sequential(
        weight_normed_linear(in_dim, 2 * in_dim),
        nn.ReLU(),
        nn.Dropout(dropout),
        weight_normed_linear(2 * in_dim, num_answers),
    )


def image_mask(image: Tensor) -> Tensor:
    """(B, O) bool: True at objects whose feature vector is not all zero (the reference
    masks all-zero rows, its padding of images with fewer boxes)."""
    return image.abs().sum(dim=-1) != 0


def _check_batch(tokens: Tensor, image: Tensor, boxes: Tensor | None, image_dim: int, owner: str) -> None:
    if image.dim() != 3 or image.shape[-1] != image_dim:
        raise ValueError(f"{owner}: image must have shape (B, O, {image_dim}), got {tuple(image.shape)}")
    if tokens.dim() != 2 or tokens.shape[0] != image.shape[0]:
        raise ValueError(
            f"{owner}: tokens must have shape (B, L) with B = {image.shape[0]}, got {tuple(tokens.shape)}"
        )
    if boxes is not None and tuple(boxes.shape) != (*image.shape[:2], 4):
        raise ValueError(
            f"{owner}: boxes must have shape (B, O, 4) = {(*image.shape[:2], 4)}, got {tuple(boxes.shape)}"
        )


class BanVQA(nn.Module):
    """BAN for VQA as ban-vqa's ``BanModel``: question GRU, G bilinear glimpses with
    residual learning of attention (BAN Eq. 11), a counter per glimpse and the classifier.

    ``forward(tokens, image, boxes)`` with tokens (B, L), image (B, O, d_v) and boxes
    (B, O, 4) returns answer logits (B, A) and the attention maps (B, G, O, L).

    Args:
        num_words: vocabulary size V (the embedding has V + 1 rows, the last padding).
        num_answers: A.
        image_dim: d_v.
        hidden_dim: H (1024 in the paper).
        glimpses: G (8 in the paper).
        counter_objects: K boxes kept by the counter (10 in the reference); None
            builds BAN without counter.
        embedding_dim: word embedding size (300).
        word_vectors: None or (V, embedding_dim) initial embedding rows (GloVe).
        second_embedding_dim: None, or the size of a second word embedding concatenated
            to the first before the GRU (ban-vqa's ``--op c``; see
            :class:`~polyfuse.nn.text.QuestionEncoder`).
        dropout, attention_dropout, classifier_dropout: 0.2, 0.5 and 0.5 as the reference.
        k, attention_rank, joint_pool: BAN's attention rank K' = k H (or set directly) and
            its joint pooling, as :class:`polyfuse.nn.BAN` (the reference: 3, 1).
    """

    def __init__(
        self,
        num_words: int,
        num_answers: int,
        image_dim: int,
        *,
        hidden_dim: int = 1024,
        glimpses: int = 8,
        counter_objects: int | None = 10,
        embedding_dim: int = 300,
        word_vectors: Tensor | None = None,
        second_embedding_dim: int | None = None,
        dropout: float = 0.2,
        attention_dropout: float = 0.5,
        classifier_dropout: float = 0.5,
        k: int = 3,
        attention_rank: int | None = None,
        joint_pool: int = 1,
    ) -> None:
        super().__init__()
        self.image_dim = int(image_dim)
        self.question = QuestionEncoder(
            num_words,
            embedding_dim=embedding_dim,
            hidden_dim=hidden_dim,
            word_vectors=word_vectors,
            second_embedding_dim=second_embedding_dim,
        )
        # Attention U, V, p_g (BAN Eq. 10, 13), joint U'_g, V'_g (Eq. 12), P_g (Eq. 11).
        self.ban = BAN(
            [self.image_dim, hidden_dim],
            hidden_dim,
            hidden_dim=hidden_dim,
            glimpses=glimpses,
            k=k,
            attention_rank=attention_rank,
            joint_pool=joint_pool,
            dropout=dropout,
            attention_dropout=attention_dropout,
        )
        # The per-glimpse constant of the attention logits (the reference's h_bias): it
        # cancels in the softmax but not in the counter, which reads the logits.
        self.attention_bias = nn.Parameter(torch.randn(glimpses))
        self.counter = None if counter_objects is None else Counter(counter_objects)
        self.count_projections = (
            None
            if counter_objects is None
            else nn.ModuleList(weight_normed_linear(counter_objects + 1, hidden_dim) for _ in range(glimpses))
        )
        self.classifier = answer_classifier(hidden_dim, num_answers, dropout=classifier_dropout)

    @property
    def glimpses(self) -> int:
        return self.ban.glimpses

    def forward(self, tokens: Tensor, image: Tensor, boxes: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_batch(tokens, image, boxes, self.image_dim, "BanVQA")
        if self.counter is not None and boxes is None:
            raise ValueError("BanVQA: the counter needs boxes (B, O, 4); use grid_boxes for grid features")
        ban = self.ban
        def drop(tensor: Tensor) -> Tensor:
            return F.dropout(tensor, ban.dropout, self.training) if ban.dropout > 0 else tensor

        question = self.question(tokens)  # X^T, (B, L, H)
        objects = image_mask(image)  # (B, O)
        logits = bilinear_attention_logits(  # (B, G, O, L), BAN Eq. 10, 13
            drop(image),
            drop(question),
            ban.attention_x.weight,
            ban.attention_y.weight,
            ban.attention_glimpses.weight,
            x_bias=ban.attention_x.bias,
            y_bias=ban.attention_y.bias,
            glimpse_bias=self.attention_bias,
            x_mask=objects,
            dropout=ban.attention_dropout,
            training=self.training,
        )
        attention = bilinear_attention_map(logits)  # BAN Eq. 8
        # U'_g, V'_g, P_g of all glimpses, each stack weight-normalised at once and split once
        # (indexing a stack per glimpse makes the backward fill a zero stack per glimpse).
        joint_x, joint_y, projections = (layers.weight.unbind(0) for layers in (
            ban.joint_x, ban.joint_y, ban.joint_projections))
        x_biases, y_biases, projection_biases = (layers.bias.unbind(0) for layers in (
            ban.joint_x, ban.joint_y, ban.joint_projections))
        stream = question
        for glimpse in range(self.glimpses):
            joint = bilinear_attention_pooling(  # f'_g, (B, H), BAN Eq. 12
                drop(image),
                drop(stream),
                attention[:, glimpse],
                joint_x[glimpse],
                joint_y[glimpse],
                x_bias=x_biases[glimpse],
                y_bias=y_biases[glimpse],
                x_mask=objects,
            )
            # BAN Eq. 11 (residual learning of attention): f_{g+1} = P_g^T f_g 1^T + f_g
            step = F.linear(drop(joint), projections[glimpse], projection_biases[glimpse])
            stream = stream + step.unsqueeze(1)
            if self.counter is not None:
                # Count features from each object's largest logit over the words (ban-vqa),
                # added to the stream through a ReLU projection.
                counts = self.counter(boxes, logits[:, glimpse].max(dim=2).values)  # (B, K + 1)
                stream = stream + F.relu(self.count_projections[glimpse](counts)).unsqueeze(1)
        return self.classifier(stream.sum(dim=1)), attention


class FusionVQA(nn.Module):
    """Any registered fusion with BAN's question encoder and classifier, for comparisons.

    ``fusion([image, question], masks=[image_mask, None])`` gives a (B, H) vector that
    the classifier maps to (B, A) answer logits. ``forward`` returns ``(logits, None)``
    so that it can stand in for :class:`BanVQA`. ``second_embedding_dim`` as in
    :class:`BanVQA` (ban-vqa's ``--op c`` question encoder).
    """

    def __init__(
        self,
        fusion: str,
        num_words: int,
        num_answers: int,
        image_dim: int,
        *,
        hidden_dim: int = 1024,
        embedding_dim: int = 300,
        word_vectors: Tensor | None = None,
        second_embedding_dim: int | None = None,
        fusion_options: Mapping[str, Any] | None = None,
        classifier_dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.image_dim = int(image_dim)
        self.question = QuestionEncoder(
            num_words,
            embedding_dim=embedding_dim,
            hidden_dim=hidden_dim,
            word_vectors=word_vectors,
            second_embedding_dim=second_embedding_dim,
        )
        self.fusion = create(
            fusion, input_dims=[self.image_dim, hidden_dim], out_dim=hidden_dim, **dict(fusion_options or {})
        )
        self.classifier = answer_classifier(hidden_dim, num_answers, dropout=classifier_dropout)

    def forward(self, tokens: Tensor, image: Tensor, boxes: Tensor | None = None) -> tuple[Tensor, None]:
        _check_batch(tokens, image, boxes, self.image_dim, "FusionVQA")
        fused = self.fusion([image, self.question(tokens)], masks=[image_mask(image), None])
        return self.classifier(fused), None
