"""Visual question answering: data tensors, training with binary cross-entropy on soft
scores (BAN section 5, following Teney et al.), evaluation with the official VQA accuracy.

Legend for shapes: ``Q`` questions, ``L`` words, ``O`` objects or grid cells,
``d_v`` image feature size, ``A`` answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from polyfuse.data.formats.features import ImageFeatures
from polyfuse.data.formats.vqa import (
    VQAQuestion,
    answer_vocabulary,
    encode_questions,
    soft_targets,
    word_vocabulary,
)
from polyfuse.metrics.vqa import VQAAccuracy
from polyfuse.nn.vqa import BanVQA, FusionVQA

__all__ = [
    "VQASplit",
    "Vocabularies",
    "build_vqa_model",
    "evaluate_vqa",
    "fit_pca",
    "load_vqa_checkpoint",
    "predict_vqa",
    "prepare_vqa",
    "project_features",
    "save_vqa_checkpoint",
    "train_vqa",
    "vqa_loss",
]


@dataclass
class VQASplit:
    """Tensors of one split; ``image_rows`` index ``features`` / ``boxes`` per question."""

    questions: list[VQAQuestion]
    tokens: Tensor  # (Q, L) long
    targets: Tensor  # (Q, A) soft scores
    image_rows: Tensor  # (Q,) long
    features: Tensor  # (N, O, d_v)
    boxes: Tensor  # (N, O, 4)

    def __len__(self) -> int:
        return len(self.questions)

    def batch(self, index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        rows = self.image_rows[index]
        return self.tokens[index], self.features[rows], self.boxes[rows], self.targets[index]


@dataclass
class Vocabularies:
    words: list[str]
    answers: list[str]
    word_vectors: Tensor | None = None  # (V, E) initial embedding rows, e.g. GloVe


def _split(questions: Sequence[VQAQuestion], features: ImageFeatures, vocab: Vocabularies, max_length: int, what: str) -> VQASplit:
    image_ids = [q.image_id for q in questions]
    features.select(image_ids, what=what)  # names every image id without features
    return VQASplit(
        list(questions),
        encode_questions(questions, vocab.words, max_length=max_length),
        soft_targets(questions, vocab.answers),
        torch.tensor([features.rows[i] for i in image_ids], dtype=torch.long),
        features.features,
        features.boxes,
    )


def fit_pca(features: Tensor, dim: int, *, max_rows: int = 20000, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Mean (d_v,) and the top ``dim`` principal directions (d_v, dim) of the real
    (not all-zero) feature rows of ``features`` (N, O, d_v), fitted on at most
    ``max_rows`` rows drawn with ``seed``. Apply with :func:`project_features`."""
    rows = features.reshape(-1, features.shape[-1])
    rows = rows[rows.abs().sum(dim=1) != 0]
    if not 1 <= dim <= min(rows.shape):
        raise ValueError(f"fit_pca: dim must lie in [1, {min(rows.shape)}], got {dim}")
    if len(rows) > max_rows:
        rows = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))[:max_rows]]
    mean = rows.mean(dim=0)
    _, _, directions = torch.linalg.svd(rows - mean, full_matrices=False)  # rows of V^T
    return mean, directions[:dim].T.contiguous()


def project_features(features: Tensor, mean: Tensor, directions: Tensor) -> Tensor:
    """(N, O, d_v) -> (N, O, dim): centred and projected; all-zero (padding) rows stay zero."""
    real = (features.abs().sum(dim=-1, keepdim=True) != 0).to(features.dtype)
    return ((features - mean) @ directions) * real


def prepare_vqa(
    train: Sequence[VQAQuestion],
    test: Sequence[VQAQuestion],
    train_features: ImageFeatures,
    test_features: ImageFeatures,
    *,
    min_answer_count: int = 9,
    min_word_count: int = 1,
    max_length: int = 14,
) -> tuple[VQASplit, VQASplit, Vocabularies]:
    """Vocabularies from the training questions and the tensors of both splits."""
    vocab = Vocabularies(
        word_vocabulary(train, min_count=min_word_count), answer_vocabulary(train, min_count=min_answer_count)
    )
    if not vocab.answers:
        raise ValueError(f"no answer occurs {min_answer_count} times in the training annotations")
    return (
        _split(train, train_features, vocab, max_length, "training questions"),
        _split(test, test_features, vocab, max_length, "test questions"),
        vocab,
    )


def build_vqa_model(
    name: str,
    vocab: Vocabularies,
    image_dim: int,
    *,
    hidden_dim: int,
    glimpses: int,
    seed: int,
    fusion_options: dict | None = None,
    dropout: float = 0.2,
    word_vectors: Tensor | None = None,
) -> nn.Module:
    """``ban`` (BAN with counter), ``ban-nocount`` or any registered fusion name.

    ``dropout`` is BAN's dropout before its linear maps and inside its attention
    (0.2 and 0.5 in the reference when left at 0.2); ``word_vectors`` (V, 300)
    initialises the word embedding (e.g. GloVe rows)."""
    torch.manual_seed(seed)
    if name in ("ban", "ban-nocount"):
        return BanVQA(
            len(vocab.words),
            len(vocab.answers),
            image_dim,
            hidden_dim=hidden_dim,
            glimpses=glimpses,
            counter_objects=10 if name == "ban" else None,
            dropout=dropout,
            attention_dropout=0.5 if dropout == 0.2 else dropout,
            word_vectors=word_vectors,
        )
    return FusionVQA(
        name,
        len(vocab.words),
        len(vocab.answers),
        image_dim,
        hidden_dim=hidden_dim,
        fusion_options=fusion_options,
        word_vectors=word_vectors,
    )


def vqa_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Binary cross-entropy of every answer against its soft score, summed over answers
    and averaged over questions (ban-vqa's ``instance_bce_with_logits``)."""
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="mean") * targets.shape[1]


@dataclass
class TrainingLog:
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_vqa(
    model: nn.Module,
    data: VQASplit,
    *,
    epochs: int,
    batch_size: int = 256,
    lr: float = 2e-3,
    clip: float = 0.25,
    seed: int = 0,
) -> TrainingLog:
    """Adamax with gradient-norm clipping at 0.25, as ban-vqa (without its warm-up schedule)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adamax(model.parameters(), lr=lr)
    log = TrainingLog()
    start = time.perf_counter()
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        total = 0.0
        for begin in range(0, len(data), batch_size):
            tokens, image, boxes, targets = data.batch(order[begin : begin + batch_size])
            logits, _ = model(tokens, image, boxes)
            loss = vqa_loss(logits, targets)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            total += loss.item() * len(tokens)
        log.losses.append(total / len(data))
        if not math.isfinite(log.losses[-1]):
            raise ValueError(f"training diverged: loss {log.losses[-1]} at epoch {len(log.losses)}")
    log.seconds = time.perf_counter() - start
    return log


@torch.no_grad()
def predict_vqa(model: nn.Module, data: VQASplit, *, batch_size: int = 512) -> Tensor:
    """Index of the highest-scoring answer per question, (Q,)."""
    model.eval()
    predictions = []
    for begin in range(0, len(data), batch_size):
        tokens, image, boxes, _ = data.batch(torch.arange(begin, min(begin + batch_size, len(data))))
        logits, _ = model(tokens, image, boxes)
        predictions.append(logits.argmax(dim=1))
    return torch.cat(predictions)


def evaluate_vqa(model: nn.Module, data: VQASplit, answers: Sequence[str]) -> dict:
    """Official VQA accuracy (percent), overall and per answer and question type."""
    predicted = predict_vqa(model, data)
    metric = VQAAccuracy()
    metric.update(
        [answers[i] for i in predicted.tolist()],
        [q.answers for q in data.questions],
        [q.answer_type for q in data.questions],
        [q.question_type for q in data.questions],
    )
    return metric.compute()


def save_vqa_checkpoint(path, model: nn.Module, vocab: Vocabularies, settings: dict) -> None:
    """Model weights, vocabularies and the settings that rebuild the model, in one file
    that :func:`torch.load` reads with ``weights_only=True``."""
    torch.save(
        {"state_dict": model.state_dict(), "words": vocab.words, "answers": vocab.answers, "settings": dict(settings)},
        path,
    )


def load_vqa_checkpoint(path) -> tuple[nn.Module, Vocabularies, dict]:
    """The model (eval mode), vocabularies and settings saved by :func:`save_vqa_checkpoint`."""
    content = torch.load(path, map_location="cpu", weights_only=True)
    missing = {"state_dict", "words", "answers", "settings"} - set(content)
    if missing:
        raise ValueError(f"{path}: not a VQA checkpoint (missing {sorted(missing)})")
    vocab = Vocabularies(list(content["words"]), list(content["answers"]))
    settings = content["settings"]
    model = build_vqa_model(
        settings["model"],
        vocab,
        settings["image_dim"],
        hidden_dim=settings["hidden_dim"],
        glimpses=settings["glimpses"],
        seed=0,
        fusion_options=settings.get("fusion_options"),
        dropout=settings.get("dropout", 0.2),
    )
    model.load_state_dict(content["state_dict"])
    return model.eval(), vocab, settings
