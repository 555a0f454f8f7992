"""Video captioning (HOCA section 4.4): the encoder-decoder and its Lightning task.

:class:`VideoCaptioner`: an encoder per modality (the paper's bidirectional LSTM,
section 3.1, :class:`~polyfuse.nn.bilstm.BiLSTMEncoder`; or ``tanh(linear)``; or none)
and the :class:`~polyfuse.nn.decoding.CaptionDecoder` (LSTM + MAF with the variant's
attention orders, exact or low-rank HOCA, or the mean-pooled baseline).

:class:`CaptioningTask`: teacher-forced cross-entropy per token (HOCA Eq. 24, label
smoothing optional; the paper uses neither label smoothing nor scheduled sampling,
so teacher forcing is all there is), Adam(W); validation logs the teacher-forced
loss; test decodes every test video with beam search (``<unk>`` never generated
unless ``allow_unknown``) and logs BLEU-1..4, METEOR,
ROUGE-L and CIDEr-D (pycocoevalcap) and the loss. Logged keys: ``train/loss``,
``val/loss``, ``test/loss``, ``test/BLEU-4``, ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from polyfuse.data.formats.captioning import UNKNOWN, Vocabulary
from polyfuse.metrics.captioning import CaptionMetrics
from polyfuse.nn.beam_search import Generated, beam_search
from polyfuse.nn.bilstm import BiLSTMEncoder
from polyfuse.nn.decoding import CaptionDecoder, caption_cross_entropy

__all__ = ["ENCODERS", "CaptioningTask", "VideoCaptioner"]

#: the per-modality encoders of :class:`VideoCaptioner`
ENCODERS = ("bilstm", "linear")


class VideoCaptioner(nn.Module):
    """Per-modality encoders and the caption decoder.

    Args:
        input_dims: raw feature size d_i per modality.
        vocab_size: V.
        orders: MAF orders (``"UBT"`` ...) or None for the mean-pooled baseline.
        low_rank: Low-Rank HOCA instead of HOCA.
        max_lengths: the longest sequence per modality (sizes exact HOCA's weights).
        feature_dim: the encoder's size (``bilstm``: hidden size per direction, the output
            has ``2 * feature_dim`` features; ``linear``: the output size), or None to
            feed the raw features.
        encoder: ``"bilstm"`` (HOCA section 3.1: a bidirectional LSTM per modality over
            its real steps, both directions concatenated) or ``"linear"``
            (``tanh(linear)`` per step, the layout of checkpoints before 0.3.0).
        embed_dim, hidden_dim, attention_dim, rank, combination, dropout: see
            :class:`~polyfuse.nn.decoding.CaptionDecoder`.
    """

    def __init__(
        self, input_dims: Sequence[int], vocab_size: int, *, orders: str | None, low_rank: bool,
        max_lengths: Sequence[int], feature_dim: int | None = 128, embed_dim: int = 128,
        hidden_dim: int = 256, attention_dim: int = 64, rank: int = 1, combination: str = "log",
        dropout: float = 0.5, encoder: str = "bilstm",
    ) -> None:
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"VideoCaptioner: unknown encoder {encoder!r}; expected one of {', '.join(ENCODERS)}")
        self.encoder = encoder if feature_dim is not None else "none"
        self.encoders: nn.ModuleList
        if feature_dim is None:
            self.encoders = nn.ModuleList(nn.Identity() for _ in input_dims)
            dims = list(input_dims)
        elif encoder == "bilstm":
            self.encoders = nn.ModuleList(BiLSTMEncoder(int(d), feature_dim, dropout=dropout) for d in input_dims)
            dims = [2 * feature_dim] * len(input_dims)
        else:
            self.encoders = nn.ModuleList(
                nn.Sequential(nn.Linear(int(d), feature_dim), nn.Tanh(), nn.Dropout(dropout)) for d in input_dims
            )
            dims = [feature_dim] * len(input_dims)
        self.decoder = CaptionDecoder(
            dims, vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, orders=orders,
            low_rank=low_rank, attention_dim=attention_dim, rank=rank, max_lengths=list(max_lengths),
            combination=combination, dropout=dropout,
        )

    def encode(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> list[Tensor]:
        """Encoded modalities (B, T_i, d'), zero at padded steps."""
        if self.encoder == "bilstm":
            return [enc(x, m.bool()) for enc, x, m in zip(self.encoders, inputs, masks, strict=True)]
        return [enc(x) * m.unsqueeze(-1) for enc, x, m in zip(self.encoders, inputs, masks, strict=True)]

    def forward(self, captions: Tensor, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
        """Teacher-forced logits (B, L - 1, V)."""
        return self.decoder(captions, self.encode(inputs, masks), masks)


class CaptioningTask(L.LightningModule):
    """Training, validation and test of a :class:`VideoCaptioner` (see the module docstring)."""

    task_type = "captioning"
    default_monitor = ("val/loss", "min")

    def __init__(
        self, model: VideoCaptioner, vocabulary: Vocabulary, *, lr: float = 1e-3, weight_decay: float = 0.0,
        label_smoothing: float = 0.0, beam_size: int = 5, max_length: int = 20, length_penalty: float = 1.0,
        meteor: bool = True, allow_unknown: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        self.vocabulary = vocabulary
        self.allow_unknown = bool(allow_unknown)
        self.lr, self.weight_decay, self.label_smoothing = float(lr), float(weight_decay), float(label_smoothing)
        self.beam_size, self.max_length, self.length_penalty = int(beam_size), int(max_length), float(length_penalty)
        self.meteor = bool(meteor)
        # the tasks' one name for their metrics; captioning scores captions at test only
        self.stage_metrics = nn.ModuleDict({"test": CaptionMetrics(meteor=self.meteor)})
        self.references: Mapping[str, Sequence[str]] = {}  # set by the engine before testing
        self.generated: dict[str, str] = {}  # video -> caption, filled by test / predict
        self.test_details: dict[str, Any] = {}
        self.checkpoint_extras: dict[str, Any] = {}

    # ---- losses -----------------------------------------------------------------
    def _loss(self, batch: Mapping[str, Any], smoothing: float) -> Tensor:
        captions = batch["captions"]
        logits = self.model(captions, batch["inputs"], batch["masks"])
        return caption_cross_entropy(logits.float(), captions[:, 1:], 0, smoothing)  # Eq. 24

    def training_step(self, batch: Mapping[str, Any], batch_index: int) -> Tensor:
        loss = self._loss(batch, self.label_smoothing)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["videos"]))
        return loss

    def validation_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self.log("val/loss", self._loss(batch, 0.0), on_step=False, on_epoch=True, batch_size=len(batch["videos"]))

    # ---- generation ---------------------------------------------------------------
    @torch.no_grad()
    def generate(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Generated:
        """Beam search (``beam_size``, ``max_length``, ``length_penalty``) for a batch of videos;
        ``<unk>`` is never generated unless ``allow_unknown``."""
        return beam_search(
            self.model.decoder, self.model.encode(inputs, masks), masks,
            begin_index=self.vocabulary.begin, end_index=self.vocabulary.end, beam_size=self.beam_size,
            max_length=self.max_length, length_penalty=self.length_penalty, banned_tokens=self.banned_tokens,
        )

    @property
    def banned_tokens(self) -> list[int]:
        """Ids never generated besides padding and begin: ``<unk>`` unless ``allow_unknown``."""
        return [] if self.allow_unknown else [self.vocabulary.index[UNKNOWN]]

    def _decode_batch(self, batch: Mapping[str, Any]) -> dict[str, str]:
        generated = self.generate(batch["inputs"], batch["masks"])
        return {video: self.vocabulary.decode(row.tolist()) for video, row in zip(batch["videos"], generated.tokens, strict=True)}

    def on_test_epoch_start(self) -> None:
        self.generated = {}
        self.stage_metrics["test"].reset()
        self._test_loss = [0.0, 0]

    def test_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        generated = self._decode_batch(batch)
        self.generated.update(generated)
        self.stage_metrics["test"].update(list(generated), list(generated.values()), [self.references.get(v) for v in generated])
        # Teacher-forced loss over every reference caption of these videos.
        videos, rows, captions = batch["videos"], [], []
        for i, video in enumerate(videos):
            for caption in self.references.get(video, []):
                rows.append(i)
                captions.append(self.vocabulary.encode(caption, self.max_length))
        if captions:
            index = torch.tensor(rows)
            length = max(len(c) for c in captions)
            tokens = torch.tensor([c + [0] * (length - len(c)) for c in captions], device=self.device)
            inputs = [x[index] for x in batch["inputs"]]
            masks = [m[index] for m in batch["masks"]]
            logits = self.model(tokens, inputs, masks).float()
            count = int((tokens[:, 1:] != 0).sum())
            loss = caption_cross_entropy(logits, tokens[:, 1:])
            self._test_loss[0] += float(loss) * count
            self._test_loss[1] += count

    def on_test_epoch_end(self) -> None:
        if not self.references:
            raise ValueError("CaptioningTask: no reference captions were given for testing")
        scores = self.stage_metrics["test"].compute()
        self.test_details = scores
        values = {f"test/{k}": float(v) for k, v in scores.items() if isinstance(v, float)}
        if self._test_loss[1]:
            values["test/loss"] = self._test_loss[0] / self._test_loss[1]
        self.log_dict(values)

    def predict_step(self, batch: Mapping[str, Any], batch_index: int) -> dict[str, str]:
        return self._decode_batch(batch)

    # ---- optimiser and checkpoints ------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["polyfuse"] = self.checkpoint_extras
