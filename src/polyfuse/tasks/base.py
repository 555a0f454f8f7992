"""The Lightning module shared by the tasks: steps, logging, optimiser, checkpoints.

A task receives its model (a :class:`~polyfuse.nn.backbones.FusionBackbone`, or
a bare fusion module of :mod:`polyfuse.nn`: any module with an ``out_dim`` and
``forward(inputs, masks) -> (B, out_dim)``) and owns only a head (Linear D -> task outputs), a loss and its
metrics. Subclasses set the output size, the loss, the metric collection and how
raw outputs become predictions.

Logged keys: ``train/loss`` (epoch mean), ``<stage>/loss`` and ``<stage>/<metric>``
for stage ``val`` and ``test``, computed once per epoch on the whole split.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch import Tensor, nn
from torchmetrics import Metric

from polyfuse.tasks.optim import OptimSettings, build_optimizer

__all__ = ["LOSSES", "FusionTask", "StagedEvaluation", "log_attention_modes"]

#: ``task.loss`` of the regression task types (sentiment, traits)
LOSSES = {"l1": nn.functional.l1_loss, "mse": nn.functional.mse_loss, "smooth_l1": nn.functional.smooth_l1_loss}


def log_attention_modes(task: L.LightningModule, stage: str, batch_size: int) -> None:
    """Log ``attention/{stage}_exact``, the fraction of the model's attention layers that
    computed exact attention in this step (MAN's ``mode="auto"`` decides per call), when
    the model has such layers (those that record ``last_mode``): the run log then says
    which mode trained and evaluated the model (``metrics.csv``, per epoch; outside the
    ``{stage}/`` metrics, so results and comparison tables do not change)."""
    layers = getattr(task, "_attention_layers", None)
    if layers is None:  # found once: the model's modules do not change during a run
        layers = [module for module in task.modules() if hasattr(module, "last_mode")]
        task._attention_layers = layers
    used = [layer for layer in layers if layer.last_mode is not None]
    if used:
        exact = sum(layer.last_mode == "exact" for layer in used) / len(used)
        task.log(f"attention/{stage}_exact", float(exact), on_step=False, on_epoch=True, batch_size=batch_size,
                 sync_dist=True)


class StagedEvaluation(L.LightningModule):
    """Validation and test of a module whose ``stage_metrics`` holds a torchmetrics
    Metric per stage (``val``, ``test``): ``_evaluation_step(stage, batch)`` logs the
    loss and updates the stage's metric; the epoch's end logs what it computes."""

    def _evaluation_step(self, stage: str, batch: Any) -> None:
        raise NotImplementedError

    def _evaluation_end(self, stage: str) -> None:
        metric = self.stage_metrics[stage]
        values = metric.compute()  # gathered over processes: the same on every rank
        metric.reset()
        self.log_dict({f"{stage}/{key}": value.float() for key, value in values.items()}, sync_dist=True)

    def validation_step(self, batch: Any, batch_index: int) -> None:
        self._evaluation_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._evaluation_end("val")

    def test_step(self, batch: Any, batch_index: int) -> None:
        self._evaluation_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._evaluation_end("test")


class FusionTask(StagedEvaluation):
    """Base class (see the module docstring).

    Args:
        backbone: the model, (inputs, masks, centre) -> (B, backbone.out_dim).
        lr: learning rate (the base of the schedule).
        weight_decay: weight decay (not applied to biases; AdamW's decoupled decay,
            Adam's and Adamax's L2 term).
        scheduler: "none", "cosine" (cosine annealing over ``max_epochs``), "ban_warmup"
            (ban-vqa's warm-up and decay, :func:`~polyfuse.tasks.optim.ban_warmup_factor`) or "step" (the rate
            times ``decay_rate`` every ``decay_every`` optimiser steps).
        max_epochs: the length of the cosine schedule.
        optimizer: "adamw", "adam" or "adamax" (ban-vqa's).
        decay_rate, decay_every: the step schedule's factor and period (only with "step").

    The optimiser and schedule: :func:`~polyfuse.tasks.optim.build_optimizer`.
    """

    task_type = ""
    default_monitor = ("val/loss", "min")

    def __init__(
        self,
        backbone: nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        scheduler: str = "none",
        max_epochs: int | None = None,
        optimizer: str = "adamw",
        decay_rate: float | None = None,
        decay_every: int | None = None,
    ) -> None:
        super().__init__()
        self.optim_settings = OptimSettings(optimizer, scheduler, max_epochs, decay_rate, decay_every)
        self.backbone = backbone
        self.head = nn.Linear(int(backbone.out_dim), self.output_size)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.stage_metrics = nn.ModuleDict({"val": self.make_metrics(), "test": self.make_metrics()})

    # ---- what a task defines ------------------------------------------------------
    @property
    def output_size(self) -> int:
        raise NotImplementedError

    def make_metrics(self) -> Metric:
        raise NotImplementedError

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        raise NotImplementedError

    def predictions(self, outputs: Tensor) -> Tensor:
        """What the metrics and ``predict`` see: (B,) values, (B, k) values or (B, C) probabilities."""
        return outputs

    # ---- forward and steps ----------------------------------------------------------
    def forward(self, batch: dict[str, Any]) -> Tensor:
        if getattr(self.backbone, "takes_centre", False):
            features = self.backbone(batch["inputs"], batch["masks"], batch.get("centre"))
        else:  # a bare fusion module of polyfuse.nn
            features = self.backbone(batch["inputs"], batch["masks"])
        return self.head(features).float()  # float32 even under bf16 autocast

    def training_step(self, batch: dict[str, Any], batch_index: int) -> Tensor:
        loss = self.compute_loss(self(batch), batch["target"])
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, "train", len(batch["row"]))
        return loss

    def _evaluation_step(self, stage: str, batch: dict[str, Any]) -> None:
        outputs = self(batch)
        target = batch["target"]
        loss = self.compute_loss(outputs, target)
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, stage, len(batch["row"]))
        self.stage_metrics[stage].update(self.predictions(outputs), target)

    def predict_step(self, batch: dict[str, Any], batch_index: int) -> dict[str, Tensor]:
        result = {"row": batch["row"], "prediction": self.predictions(self(batch))}
        if "target" in batch:
            result["target"] = batch["target"]
        return result

    # ---- optimiser and checkpoints -------------------------------------------------
    def configure_optimizers(self) -> Any:
        return build_optimizer(self, self.optim_settings, lr=self.lr, weight_decay=self.weight_decay)

