"""Video captioning (HOCA section 4.4): the Lightning task around a
:class:`~polyfuse.nn.models.captioner.VideoCaptioner`.

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
from torch import Tensor

from polyfuse.data.formats.captioning import UNKNOWN, Vocabulary
from polyfuse.metrics.captioning import caption_metrics
from polyfuse.nn.beam_search import Generated, beam_search
from polyfuse.nn.decoding import caption_cross_entropy
from polyfuse.nn.models.captioner import VideoCaptioner

__all__ = ["CaptioningTask"]


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
        self._test_loss = [0.0, 0]

    def test_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self.generated.update(self._decode_batch(batch))
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
        scores = caption_metrics(self.references, self.generated, meteor=self.meteor)
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
