"""Metric classes: accumulate predictions and targets with ``update``, compute with
the functional twins of :mod:`polyfuse.metrics.functional`.

States are concatenated across batches and, under DDP, gathered across processes
(torchmetrics' ``dist_reduce_fx="cat"``), so every metric is computed on the whole
split exactly once, whatever the batch size or the number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from polyfuse.metrics.functional import classification_metrics, sentiment_metrics, trait_metrics

__all__ = ["ClassificationMetrics", "SentimentMetrics", "TraitMetrics", "metric_values"]


class _CatMetric(Metric):
    """Keeps every prediction and target; subclasses say how to compute."""

    full_state_update = False
    is_differentiable = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("preds", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.shape[0] != target.shape[0]:
            raise ValueError(f"{preds.shape[0]} predictions for {target.shape[0]} targets")
        self.preds.append(preds.detach().float())
        self.target.append(target.detach())

    def _gathered(self) -> tuple[Tensor, Tensor]:
        return dim_zero_cat(self.preds), dim_zero_cat(self.target)


class SentimentMetrics(_CatMetric):
    """MOSI sentiment metrics (see :func:`polyfuse.metrics.functional.sentiment_metrics`)."""

    def compute(self) -> dict[str, Tensor]:
        preds, target = self._gathered()
        return sentiment_metrics(preds, target.float())


class TraitMetrics(_CatMetric):
    """POM per-trait metrics (see :func:`polyfuse.metrics.functional.trait_metrics`)."""

    def __init__(self, ranges: Sequence[Sequence[float]], names: Sequence[str]) -> None:
        super().__init__()
        self.ranges = [tuple(float(v) for v in r) for r in ranges]
        self.names = list(names)

    def compute(self) -> dict[str, Tensor]:
        preds, target = self._gathered()
        return trait_metrics(preds, target.float(), ranges=self.ranges, names=self.names)


class ClassificationMetrics(_CatMetric):
    """Accuracy and macro F1 (see :func:`polyfuse.metrics.functional.classification_metrics`)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = int(num_classes)

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.dim() == 2:
            preds = preds.argmax(dim=-1)
        super().update(preds.float(), target.long())

    def compute(self) -> dict[str, Tensor]:
        preds, target = self._gathered()
        return classification_metrics(preds.long(), target.long(), num_classes=self.num_classes)


def metric_values(metrics: dict[str, Tensor]) -> dict[str, float]:
    """Plain floats of a computed metric dict."""
    return {key: float(torch.as_tensor(value)) for key, value in metrics.items()}
