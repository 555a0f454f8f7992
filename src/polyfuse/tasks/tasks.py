"""The three tasks: sentiment regression (MOSI), multi-target traits (POM), classification."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from polyfuse.metrics import ClassificationMetrics, SentimentMetrics, TraitMetrics
from polyfuse.tasks.base import FusionTask

__all__ = ["LOSSES", "TASKS", "ClassificationTask", "SentimentTask", "TraitsTask", "task_class"]

LOSSES = {"l1": F.l1_loss, "mse": F.mse_loss, "smooth_l1": F.smooth_l1_loss}


def _regression_loss(name: str):
    if name not in LOSSES:
        raise ValueError(f"unknown regression loss {name!r}; expected one of {', '.join(LOSSES)}")
    return LOSSES[name]


class SentimentTask(FusionTask):
    """One score per sample (MOSI: [-3, 3]); L1 loss by default; MOSI metrics."""

    task_type = "sentiment"
    default_monitor = ("val/mae", "min")

    def __init__(self, backbone: nn.Module, *, loss: str = "l1", **options) -> None:
        self.loss_function = _regression_loss(loss)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return 1

    def make_metrics(self) -> Metric:
        return SentimentMetrics()

    def predictions(self, outputs: Tensor) -> Tensor:
        return outputs[:, 0]

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return self.loss_function(outputs[:, 0], target.float())


class TraitsTask(FusionTask):
    """k scores per sample (POM speaker traits); per-target MAE and MA5 / MA7."""

    task_type = "traits"
    default_monitor = ("val/mae", "min")

    def __init__(
        self, backbone: nn.Module, *, names: Sequence[str], ranges: Sequence[Sequence[float]],
        loss: str = "l1", **options,
    ) -> None:
        self.names = list(names)
        self.ranges = [list(r) for r in ranges]
        self.loss_function = _regression_loss(loss)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return len(self.names)

    def make_metrics(self) -> Metric:
        return TraitMetrics(self.ranges, self.names)

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return self.loss_function(outputs, target.float())


class ClassificationTask(FusionTask):
    """One of C classes per sample; cross-entropy; accuracy and macro F1."""

    task_type = "classification"
    default_monitor = ("val/loss", "min")

    def __init__(self, backbone: nn.Module, *, num_classes: int, label_smoothing: float = 0.0, **options) -> None:
        if num_classes < 2:
            raise ValueError(f"classification needs at least 2 classes, got {num_classes}")
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return self.num_classes

    def make_metrics(self) -> Metric:
        return ClassificationMetrics(self.num_classes)

    def predictions(self, outputs: Tensor) -> Tensor:
        return outputs.softmax(dim=-1)

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(outputs, target.long(), label_smoothing=self.label_smoothing)


TASKS: dict[str, type[FusionTask]] = {
    "sentiment": SentimentTask,
    "traits": TraitsTask,
    "classification": ClassificationTask,
}


def task_class(name: str) -> type[FusionTask]:
    if name not in TASKS:
        raise ValueError(f"unknown task type {name!r}; expected one of {', '.join(TASKS)}")
    return TASKS[name]
