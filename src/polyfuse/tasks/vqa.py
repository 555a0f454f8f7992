"""Visual question answering as an engine task (``task.type: vqa``): a model of
:mod:`polyfuse.nn.models.vqa`, binary cross-entropy on soft scores (BAN section 5,
following Teney et al.) and the official VQA accuracy, overall and per type.

Legend for shapes: ``B`` questions of a batch, ``A`` answers, ``K`` candidate answers of
a question (see :mod:`polyfuse.data.vqa_data`), ``T`` types of the breakdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from polyfuse.tasks.base import FusionTask, check_optimizer, log_attention_modes

__all__ = ["VQAScore", "VQATask", "vqa_loss"]


def vqa_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Binary cross-entropy of every answer against its soft score, summed over answers
    and averaged over questions (ban-vqa's ``instance_bce_with_logits``)."""
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="mean") * targets.shape[1]


class VQAScore(Metric):
    """Official VQA accuracy accumulated over batches, overall and per type.

    ``update(predicted, answer_ids, answer_scores, types)``: predicted (B,) answer
    indices; answer_ids (B, K) and answer_scores (B, K), the accuracy of each candidate
    (-1 pads); types (B,) in [0, T) (-1: a type unseen in training, counted overall
    only). ``compute()`` gives ``acc`` and ``acc/<type name>`` as fractions in [0, 1].
    """

    full_state_update = False

    def __init__(self, type_names: Sequence[str]) -> None:
        super().__init__()
        self.type_names = list(type_names)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("type_total", torch.zeros(len(self.type_names), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("type_count", torch.zeros(len(self.type_names), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predicted: Tensor, answer_ids: Tensor, answer_scores: Tensor, types: Tensor) -> None:
        hit = (answer_ids == predicted.unsqueeze(1)) & (answer_ids >= 0)  # (B, K)
        scores = (answer_scores * hit).sum(dim=1).double()  # (B,)
        self.total += scores.sum()
        self.count += scores.numel()
        known = types >= 0
        self.type_total.index_add_(0, types[known], scores[known])
        self.type_count.index_add_(0, types[known], torch.ones_like(scores[known]))

    def compute(self) -> dict[str, Tensor]:
        values = {"acc": (self.total / self.count.clamp_min(1)).float()}
        for i, name in enumerate(self.type_names):
            if self.type_count[i] > 0:
                values[f"acc/{name}"] = (self.type_total[i] / self.type_count[i]).float()
        return values


class VQATask(L.LightningModule):
    """A VQA model (:func:`polyfuse.nn.models.vqa.build_vqa_model`) trained with :func:`vqa_loss`; logs
    ``<stage>/loss``, ``<stage>/acc`` (official VQA accuracy) and ``<stage>/acc/<type>``.

    ``forward(batch)`` returns (logits (B, A), attention (B, G, O, L) or None).
    Optimiser and checkpoint extras as :class:`~polyfuse.tasks.base.FusionTask`.
    """

    task_type = "vqa"
    default_monitor = ("val/acc", "max")
    #: answers per question that :meth:`predict_step` returns (``polyfuse predict --top-k``)
    predict_top_k = 1

    def __init__(
        self,
        model: nn.Module,
        *,
        type_names: Sequence[str],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        scheduler: str = "none",
        max_epochs: int | None = None,
        optimizer: str = "adamw",
    ) -> None:
        super().__init__()
        check_optimizer(optimizer, scheduler, max_epochs)
        self.model = model
        self.lr, self.weight_decay, self.scheduler, self.max_epochs = float(lr), float(weight_decay), scheduler, max_epochs
        self.optimizer_name = optimizer
        self.stage_metrics = nn.ModuleDict({"val": VQAScore(type_names), "test": VQAScore(type_names)})
        self.checkpoint_extras: dict[str, Any] = {}

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        logits, attention = self.model(batch["tokens"], batch["image"], batch["boxes"])
        return logits.float(), attention

    def training_step(self, batch: Mapping[str, Tensor], batch_index: int) -> Tensor:
        loss = vqa_loss(self(batch)[0], batch["target"])
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, "train", len(batch["row"]))
        return loss

    def _evaluation_step(self, stage: str, batch: Mapping[str, Tensor]) -> None:
        logits = self(batch)[0]
        loss = vqa_loss(logits, batch["target"])
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, stage, len(batch["row"]))
        self.stage_metrics[stage].update(logits.argmax(dim=1), batch["answer_ids"], batch["answer_scores"], batch["answer_type"])

    def _evaluation_end(self, stage: str) -> None:
        metric = self.stage_metrics[stage]
        values = metric.compute()
        metric.reset()
        self.log_dict({f"{stage}/{key}": value for key, value in values.items()}, sync_dist=True)

    def validation_step(self, batch: Mapping[str, Tensor], batch_index: int) -> None:
        self._evaluation_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._evaluation_end("val")

    def test_step(self, batch: Mapping[str, Tensor], batch_index: int) -> None:
        self._evaluation_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._evaluation_end("test")

    def predict_step(self, batch: Mapping[str, Tensor], batch_index: int) -> dict[str, Tensor]:
        """The :attr:`predict_top_k` answers of each question, best first: ``answers``
        (B, k) and their ``scores`` (B, k), each the sigmoid of its logit, the probability
        the model was trained to give that answer's soft score (:func:`vqa_loss`; the
        answers are scored independently, so the scores need not sum to 1); ``answer``
        and ``score`` (B,), the first of them."""
        logits = self(batch)[0]
        # ranked by logit (the sigmoid is monotone but saturates to 1.0 in float32); a
        # stable sort keeps the lower index first on ties, as the argmax of evaluation does
        ranked, answers = torch.sort(logits, dim=1, descending=True, stable=True)
        answers, scores = answers[:, : self.predict_top_k], torch.sigmoid(ranked[:, : self.predict_top_k])
        return {"row": batch["row"], "answer": answers[:, 0], "score": scores[:, 0], "answers": answers, "scores": scores}

    # The same optimiser (AdamW or ban-vqa's Adamax, no decay on biases), schedule and
    # checkpoint extras as every task.
    configure_optimizers = FusionTask.configure_optimizers
    on_save_checkpoint = FusionTask.on_save_checkpoint
