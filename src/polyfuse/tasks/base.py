"""The Lightning module shared by the tasks: steps, logging, optimiser, checkpoints.

A task receives its model (a :class:`~polyfuse.tasks.backbone.FusionBackbone`, or
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
import torch
from torch import Tensor, nn
from torchmetrics import Metric

__all__ = ["SCHEDULERS", "FusionTask"]

SCHEDULERS = ("none", "cosine")


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


class FusionTask(L.LightningModule):
    """Base class (see the module docstring).

    Args:
        backbone: the model, (inputs, masks, centre) -> (B, backbone.out_dim).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay (not applied to biases).
        scheduler: "none" or "cosine" (cosine annealing over ``max_epochs``).
        max_epochs: the length of the cosine schedule.
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
    ) -> None:
        super().__init__()
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
        if scheduler == "cosine" and not max_epochs:
            raise ValueError("the cosine scheduler needs max_epochs")
        self.backbone = backbone
        self.head = nn.Linear(int(backbone.out_dim), self.output_size)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.scheduler = scheduler
        self.max_epochs = max_epochs
        self.stage_metrics = nn.ModuleDict({"val": self.make_metrics(), "test": self.make_metrics()})
        # What the engine wants stored beside the weights (configuration,
        # standardisation statistics, label encoding): see on_save_checkpoint.
        self.checkpoint_extras: dict[str, Any] = {}

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

    def _evaluation_end(self, stage: str) -> None:
        metric = self.stage_metrics[stage]
        values = metric.compute()  # gathered over processes: the same on every rank
        metric.reset()
        self.log_dict({f"{stage}/{key}": value.float() for key, value in values.items()}, sync_dist=True)

    def validation_step(self, batch: dict[str, Any], batch_index: int) -> None:
        self._evaluation_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._evaluation_end("val")

    def test_step(self, batch: dict[str, Any], batch_index: int) -> None:
        self._evaluation_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._evaluation_end("test")

    def predict_step(self, batch: dict[str, Any], batch_index: int) -> dict[str, Tensor]:
        result = {"row": batch["row"], "prediction": self.predictions(self(batch))}
        if "target" in batch:
            result["target"] = batch["target"]
        return result

    # ---- optimiser and checkpoints -------------------------------------------------
    def configure_optimizers(self) -> Any:
        decay, no_decay = [], []
        for name, parameter in self.named_parameters():
            if parameter.requires_grad:
                (no_decay if name.endswith("bias") else decay).append(parameter)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.lr,
        )
        if self.scheduler == "none":
            return optimizer
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(self.max_epochs))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["polyfuse"] = self.checkpoint_extras
