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
import torch
from torch import Tensor, nn
from torchmetrics import Metric

__all__ = ["LOSSES", "OPTIMIZERS", "SCHEDULERS", "FusionTask", "StagedEvaluation", "ban_warmup_factor", "build_optimizer", "check_optimizer"]

OPTIMIZERS = ("adamw", "adamax")
#: ``task.loss`` of the regression task types (sentiment, traits)
LOSSES = {"l1": nn.functional.l1_loss, "mse": nn.functional.mse_loss, "smooth_l1": nn.functional.smooth_l1_loss}

SCHEDULERS = ("none", "cosine", "ban_warmup")

# ban-vqa's train.py: lr_default times these in epochs 0-3 (gradual warm-up), then the
# last of them until epochs 10, 12, 14, 16, 18 (range(10, 20, 2)) each multiply it by 0.25.
_BAN_WARMUP = (0.5, 1.0, 1.5, 2.0)
_BAN_DECAY_EPOCHS = range(10, 20, 2)
_BAN_DECAY_RATE = 0.25


def ban_warmup_factor(epoch: int) -> float:
    """The multiple of the base learning rate in ``epoch`` (0-based) of ban-vqa's schedule
    (``train.py``): 0.5, 1, 1.5, 2 in epochs 0-3, 2 until epoch 9, then times 0.25 at
    epochs 10, 12, 14, 16 and 18 (2 x 0.25^5 from epoch 18 on). With ban-vqa's base
    1e-3 the peak is 2e-3; BAN section 5.4 writes min(i x 1e-3, 4e-3) for epoch i from 1
    and a decay of 1/4 every 2 epochs after 10, which is this schedule at base 2e-3."""
    if epoch < len(_BAN_WARMUP):
        return _BAN_WARMUP[epoch]
    decays = sum(1 for decay_epoch in _BAN_DECAY_EPOCHS if decay_epoch <= epoch)
    return _BAN_WARMUP[-1] * _BAN_DECAY_RATE**decays


def build_optimizer(
    module: nn.Module, *, optimizer: str, lr: float, weight_decay: float, scheduler: str, max_epochs: int | None
) -> Any:
    """``torch.optim.AdamW`` or ``Adamax`` over the trainable parameters of ``module`` (no
    weight decay on biases), with the epoch-wise schedule of ``scheduler``: none, cosine
    annealing over ``max_epochs`` or ban-vqa's warm-up and decay (:func:`ban_warmup_factor`,
    through ``LambdaLR``). What ``configure_optimizers`` returns."""
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        if parameter.requires_grad:
            (no_decay if name.endswith("bias") else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kind = {"adamw": torch.optim.AdamW, "adamax": torch.optim.Adamax}[optimizer]
    built = kind(groups, lr=lr)
    if scheduler == "none":
        return built
    if scheduler == "cosine":
        schedule: Any = torch.optim.lr_scheduler.CosineAnnealingLR(built, T_max=int(max_epochs))
    else:
        schedule = torch.optim.lr_scheduler.LambdaLR(built, ban_warmup_factor)
    return {"optimizer": built, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}


def check_optimizer(optimizer: str, scheduler: str, max_epochs: int | None) -> None:
    """Refuse an unknown optimiser or schedule, or cosine without ``max_epochs``."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    if scheduler == "cosine" and not max_epochs:
        raise ValueError("the cosine scheduler needs max_epochs")


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
            Adamax's L2 term).
        scheduler: "none", "cosine" (cosine annealing over ``max_epochs``) or
            "ban_warmup" (ban-vqa's warm-up and decay, :func:`ban_warmup_factor`).
        max_epochs: the length of the cosine schedule.
        optimizer: "adamw" or "adamax" (ban-vqa's).
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
    ) -> None:
        super().__init__()
        check_optimizer(optimizer, scheduler, max_epochs)
        self.backbone = backbone
        self.head = nn.Linear(int(backbone.out_dim), self.output_size)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.scheduler = scheduler
        self.max_epochs = max_epochs
        self.optimizer_name = optimizer
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
        return build_optimizer(
            self, optimizer=self.optimizer_name, lr=self.lr, weight_decay=self.weight_decay,
            scheduler=self.scheduler, max_epochs=self.max_epochs,
        )  # fmt: skip

