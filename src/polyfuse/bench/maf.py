"""``polyfuse bench maf``: HOCA Eq. 19 as printed against the form that learns, measured.

A small but real captioning experiment on the shared MSVD subset
(``../shared/data/msvd``, 70 / 10 / 20 videos): the same model, seed and data are
trained twice, once with MAF's literal Eq. 19 (``softmax(sum_k theta_k alpha_k)``)
and once with the default form (``softmax(sum_k theta_k log alpha_k)``), and both
are scored on the test videos.

* Two modalities per video: appearance, the VGG frame features of
  ``features_vgg.npz`` (every ``frame_stride``-th of the 80 rows), and a
  frame-difference stream, ``vgg[t + 1] - vgg[t]`` between consecutive sampled
  rows (one step shorter): a crude motion signal computed from the appearance
  features, since the subset ships no motion features. To keep the run to a few
  CPU minutes, the 4096-d rows are first projected on their ``pca_dim`` leading
  principal directions, fitted on the training videos' appearance rows (the same
  projection for both streams, so the difference stream is the difference of the
  projected rows); each stream then goes through its own trainable
  ``tanh(linear)`` encoder (``pca_dim`` -> ``feature_dim``).
* Decoder: :class:`polyfuse.nn.decoding.CaptionDecoder` (LSTM, MAF conditioned on
  h_t with unary and binary exact-HOCA attention, Eq. 22 output), teacher forcing,
  Adam, a fixed number of epochs; greedy decoding of the test videos, which never
  generates ``<unk>`` (as ``task.type: captioning`` with its default
  ``captioning.allow_unknown: false``) unless ``allow_unknown``.
* Measures: the mean entropy of each modality's Eq. 19 attention over the decoded
  steps (nats, and divided by log T, where 1 means uniform), BLEU-4, CIDEr-D,
  ROUGE-L and METEOR (:func:`polyfuse.metrics.captioning.caption_metrics`: pycocoevalcap,
  PTB tokenisation; without Java its Python twin, and METEOR is left out with a
  note), and the teacher-forced test cross-entropy. The vocabulary and the model
  are those of ``task.type: captioning`` (:class:`~polyfuse.data.formats.captioning.Vocabulary`,
  :class:`~polyfuse.nn.models.captioner.VideoCaptioner` with dropout 0).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from polyfuse.bench.results import result_header
from polyfuse.data.formats.captioning import UNKNOWN, Vocabulary, ptb_tokenize
from polyfuse.metrics.captioning import caption_metrics
from polyfuse.nn.decoding import caption_cross_entropy
from polyfuse.nn.models.captioner import VideoCaptioner

__all__ = ["FULL", "QUICK", "MAFBenchSettings", "attention_entropy", "run_maf_bench"]


@dataclasses.dataclass(frozen=True)
class MAFBenchSettings:
    data_dir: Path = Path("../shared/data/msvd")
    combinations: tuple[str, ...] = ("literal", "log")
    seed: int = 0
    frame_stride: int = 4  # 80 VGG rows -> 20 appearance steps, 19 difference steps
    pca_dim: int = 256
    feature_dim: int = 128
    embed_dim: int = 128
    hidden_dim: int = 256
    attention_dim: int = 64
    orders: str = "UB"
    epochs: int = 15
    batch_size: int = 64
    learning_rate: float = 2e-3
    max_words: int = 20
    min_count: int = 2
    max_decode_length: int = 20
    train_videos: int | None = None  # None: the whole train split
    meteor: bool = True  # METEOR starts a Java process that loads its paraphrase tables
    allow_unknown: bool = False  # as captioning.allow_unknown: greedy decoding never emits <unk>


FULL = MAFBenchSettings()
#: Seconds: a smoke test of the pipeline, not a measurement.
QUICK = dataclasses.replace(
    FULL, epochs=1, pca_dim=32, feature_dim=16, embed_dim=16, hidden_dim=32, attention_dim=8, train_videos=8
)


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def _load_msvd(data_dir: Path) -> tuple[list[str], np.ndarray, dict[str, list[str]], dict]:
    data_dir = Path(data_dir)
    needed = ["features_vgg.npz", "captions.json", "splits.json"]
    missing = [name for name in needed if not (data_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"bench maf: {data_dir} lacks {', '.join(missing)}; pass --data-dir pointing at the "
            "shared MSVD folder (see its PROVENANCE.md)"
        )
    with np.load(data_dir / "features_vgg.npz") as archive:
        ids = [str(v) for v in archive["video_ids"]]
        vgg = archive["vgg"]
    captions = json.loads((data_dir / "captions.json").read_text(encoding="utf-8"))
    splits = json.loads((data_dir / "splits.json").read_text(encoding="utf-8"))
    return ids, vgg, captions, splits


def _streams(
    vgg: np.ndarray, stride: int, pca_dim: int, fit_rows: Sequence[int]
) -> tuple[Tensor, Tensor]:
    """(N, T, p) projected appearance rows and (N, T - 1, p) differences of consecutive rows.

    The projection is on the ``p = pca_dim`` leading principal directions of the
    appearance rows of the videos ``fit_rows`` (the training videos), after
    subtracting their mean.
    """
    appearance = torch.from_numpy(vgg[:, ::stride].astype(np.float32))  # (N, T, 4096)
    if appearance.shape[1] < 2:
        raise ValueError(f"bench maf: frame_stride {stride} leaves fewer than 2 frames")
    fit = appearance[list(fit_rows)].reshape(-1, appearance.shape[-1])
    mean = fit.mean(dim=0)
    _, _, directions = torch.linalg.svd(fit - mean, full_matrices=False)  # rows: directions
    projected = (appearance - mean) @ directions[:pca_dim].T  # (N, T, p)
    return projected, projected[:, 1:] - projected[:, :-1]


def _pad(sequences: list[list[int]]) -> Tensor:
    length = max(len(s) for s in sequences)
    return torch.tensor([s + [0] * (length - len(s)) for s in sequences], dtype=torch.long)


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def _captioner(vocab_size: int, settings: MAFBenchSettings, combination: str,
               lengths: Sequence[int], input_dim: int) -> VideoCaptioner:
    """Two tanh(linear) stream encoders and the MAF caption decoder (no dropout)."""
    return VideoCaptioner(
        [input_dim] * 2, vocab_size, orders=settings.orders, low_rank=False, max_lengths=list(lengths),
        feature_dim=settings.feature_dim, embed_dim=settings.embed_dim, hidden_dim=settings.hidden_dim,
        attention_dim=settings.attention_dim, combination=combination, dropout=0.0,
    )


# ---------------------------------------------------------------------------
# Measures
# ---------------------------------------------------------------------------


def attention_entropy(attention: Tensor) -> Tensor:
    """Entropy -sum_t a_t log a_t (nats) of each row of (..., T) attention (0 log 0 = 0)."""
    logs = torch.where(attention > 0, attention.log(), torch.zeros_like(attention))
    return -(attention * logs).sum(dim=-1)


def _score_captions(
    references: dict[str, list[str]], hypotheses: dict[str, str], meteor: bool = True
) -> dict:
    """BLEU-1..4, METEOR, ROUGE-L and CIDEr-D (:func:`polyfuse.metrics.captioning.caption_metrics`)."""
    scores = caption_metrics(references, hypotheses, meteor=meteor)
    errors = scores.pop("errors")
    if "METEOR" in errors:
        scores["note"] = "METEOR not computed: " + errors["METEOR"]
    return scores


# ---------------------------------------------------------------------------
# One variant
# ---------------------------------------------------------------------------


def _encode(model: VideoCaptioner, streams: Sequence[Tensor]) -> list[Tensor]:
    return model.encode(streams, [torch.ones(x.shape[:2], dtype=torch.bool) for x in streams])


def _generate(
    model: VideoCaptioner, inputs: Sequence[Tensor], vocabulary: Vocabulary, settings: MAFBenchSettings
) -> tuple[Tensor, list]:
    """Greedy captions of encoded ``inputs``; ``<unk>`` is never generated unless
    ``settings.allow_unknown`` (the rule of ``task.type: captioning``)."""
    banned = [] if settings.allow_unknown else [vocabulary.index[UNKNOWN]]
    return model.decoder.greedy(
        inputs,
        begin_index=vocabulary.begin,
        end_index=vocabulary.end,
        max_length=settings.max_decode_length,
        banned_tokens=banned,
    )


def _train_and_score(
    combination: str,
    settings: MAFBenchSettings,
    data: dict[str, Any],
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    vocabulary: Vocabulary = data["vocabulary"]
    streams: list[Tensor] = data["streams"]
    model = _captioner(len(vocabulary.words), settings, combination,
                       [x.shape[1] for x in streams], streams[0].shape[-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    pairs = data["train_pairs"]  # (video row, token ids)
    start = time.perf_counter()
    losses = []
    for epoch in range(settings.epochs):
        model.train()
        order = torch.randperm(len(pairs), generator=generator).tolist()
        total, batches = 0.0, 0
        for first in range(0, len(order), settings.batch_size):
            chosen = [pairs[i] for i in order[first : first + settings.batch_size]]
            rows = torch.tensor([row for row, _ in chosen])
            captions = _pad([ids for _, ids in chosen])
            inputs = _encode(model, [x[rows] for x in streams])
            logits = model.decoder(captions, inputs)
            loss = caption_cross_entropy(logits, captions[:, 1:])  # Eq. 24, per token
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            total, batches = total + float(loss.detach()), batches + 1
        losses.append(total / batches)
        if progress:
            progress(f"[{combination}] epoch {epoch + 1}/{settings.epochs}: loss {losses[-1]:.3f}")
    train_seconds = time.perf_counter() - start

    model.eval()
    test_rows = torch.tensor(data["test_rows"])
    with torch.no_grad():
        inputs = _encode(model, [x[test_rows] for x in streams])
        tokens, steps = _generate(model, inputs, vocabulary, settings)
        test_pairs = data["test_pairs"]
        captions = _pad([ids for _, ids in test_pairs])
        positions = torch.tensor([data["test_rows"].index(row) for row, _ in test_pairs])
        test_loss = float(caption_cross_entropy(
            model.decoder(captions, [x[positions] for x in inputs]), captions[:, 1:]
        ))
    # Entropy of each modality's Eq. 19 attention at every generated step up to the end token.
    alive = tokens != vocabulary.pad  # (B, S): generated steps, end token included
    entropy = {}
    for modality, name in enumerate(("appearance", "difference")):
        per_step = torch.stack([attention_entropy(s.attention[modality]) for s in steps], 1)
        length = steps[0].attention[modality].shape[1]
        mean = float(per_step[alive].mean())
        entropy[name] = {"nats": mean, "relative": mean / math.log(length), "steps": length,
                         "uniform_nats": math.log(length)}
    ids = data["test_ids"]
    hypotheses = {video: vocabulary.decode(row.tolist()) for video, row in zip(ids, tokens, strict=True)}
    references = {video: data["captions"][video] for video in ids}
    scores = _score_captions(references, hypotheses, settings.meteor)
    theta = [p.detach().tolist() for p in model.decoder.maf.order_weights]
    return {
        "combination": combination,
        "train_loss_per_epoch": losses,
        "test_cross_entropy": test_loss,
        "attention_entropy": entropy,
        "scores": scores,
        "theta": theta,
        "train_seconds": train_seconds,
        "examples": {video: {"generated": hypotheses[video], "reference": references[video][0]}
                     for video in ids[:5]},
        "distinct_captions": len(set(hypotheses.values())),
        "captions_with_unknown": sum(UNKNOWN in h.split() for h in hypotheses.values()),
    }


def run_maf_bench(
    settings: MAFBenchSettings = FULL, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train and score each Eq. 19 form in ``settings.combinations``; a JSON-ready dict."""
    ids, vgg, captions, splits = _load_msvd(settings.data_dir)
    row_of = {video: row for row, video in enumerate(ids)}
    train_ids = list(splits["train"])[: settings.train_videos]
    test_ids = list(splits["test"])
    for video in [*train_ids, *test_ids]:
        if video not in row_of or not captions.get(video):
            raise ValueError(f"bench maf: video {video!r} has no features or no captions")
    vocabulary = Vocabulary.build((c for v in train_ids for c in captions[v]), settings.min_count)
    train_pairs = [
        (row_of[v], vocabulary.encode(c, settings.max_words))
        for v in train_ids for c in captions[v] if ptb_tokenize(c)
    ]
    test_pairs = [
        (row_of[v], vocabulary.encode(c, settings.max_words))
        for v in test_ids for c in captions[v] if ptb_tokenize(c)
    ]
    data = {
        "vocabulary": vocabulary,
        "streams": list(_streams(vgg, settings.frame_stride, settings.pca_dim,
                                 [row_of[v] for v in train_ids])),
        "train_pairs": train_pairs,
        "test_ids": test_ids,
        "test_rows": [row_of[v] for v in test_ids],
        "test_pairs": test_pairs,
        "captions": captions,
    }
    settings_json = {k: str(v) if isinstance(v, Path) else v
                     for k, v in dataclasses.asdict(settings).items()}
    payload = result_header("maf", settings_json)
    payload["data"] = {
        "train_videos": len(train_ids), "test_videos": len(test_ids),
        "train_captions": len(train_pairs), "vocabulary": len(vocabulary.words),
        "appearance_steps": data["streams"][0].shape[1],
        "difference_steps": data["streams"][1].shape[1],
    }
    payload["variants"] = {
        combination: _train_and_score(combination, settings, data, progress)
        for combination in settings.combinations
    }
    return payload
