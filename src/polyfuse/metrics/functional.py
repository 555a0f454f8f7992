"""Metrics as pure functions of whole prediction and target tensors.

Each function returns a dict of 0-d float tensors; the metric classes of
:mod:`polyfuse.metrics.classes` accumulate predictions over batches (and over
processes under DDP) and call these on the concatenated tensors. The
computations themselves are torchmetrics' functional metrics.

Shapes: ``N`` samples, ``k`` targets, ``C`` classes.

Conventions (those of the public CMU-MOSI and POM evaluation code):

- sentiment, MOSI (labels in [-3, 3]):
  ``mae``; ``corr`` (Pearson); ``acc2_has0`` and ``f1_has0``: binary accuracy and
  support-weighted F1 of ``pred >= 0`` against ``label >= 0`` on all samples;
  ``acc2_non0`` and ``f1_non0``: the same for ``pred > 0`` against ``label > 0``
  on the samples whose label is not 0; ``acc7``: accuracy of
  ``round(clip(pred, -3, 3))`` against ``round(clip(label, -3, 3))`` (7 classes;
  rounding half to even, as numpy and torch do).
- traits, POM (k targets, target i with an integer range [low_i, high_i]):
  ``mae/<name>``, ``corr/<name>`` (Pearson; NaN for a constant prediction) and
  ``ma<c>/<name>`` with c = high_i - low_i + 1 classes (accuracy of the rounded,
  clipped prediction), their means ``mae``, ``corr`` (over the defined ones) and ``ma``.
- classification: ``acc`` (accuracy) and ``f1_macro`` (macro-averaged F1 over the
  classes that occur in predictions or targets, as scikit-learn's default).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics.functional import mean_absolute_error, pearson_corrcoef
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

__all__ = [
    "SENTIMENT_METRICS",
    "classification_metrics",
    "round_to_classes",
    "sentiment_metrics",
    "trait_metrics",
]

SENTIMENT_METRICS = ("mae", "corr", "acc2_has0", "f1_has0", "acc2_non0", "f1_non0", "acc7")


def _as_vector(tensor: Tensor, what: str) -> Tensor:
    if tensor.dim() == 2 and tensor.shape[1] == 1:
        tensor = tensor[:, 0]
    if tensor.dim() != 1:
        raise ValueError(f"{what} must have shape (N,) or (N, 1), got {tuple(tensor.shape)}")
    return tensor.float()


def _binary(predicted: Tensor, actual: Tensor) -> tuple[Tensor, Tensor]:
    """Accuracy and support-weighted F1 of two (N,) bool tensors."""
    if predicted.numel() == 0:
        nan = torch.tensor(float("nan"))
        return nan, nan
    p, t = predicted.long(), actual.long()
    accuracy = multiclass_accuracy(p, t, num_classes=2, average="micro")
    f1 = multiclass_f1_score(p, t, num_classes=2, average="weighted")
    return accuracy, f1


def round_to_classes(values: Tensor, low: float, high: float) -> Tensor:
    """Class index of ``round(clip(values, low, high)) - low`` (long, same shape)."""
    return (torch.round(values.clamp(low, high)) - round(low)).long()


def sentiment_metrics(preds: Tensor, target: Tensor) -> dict[str, Tensor]:
    """MOSI metrics of (N,) predictions against (N,) sentiment labels in [-3, 3]."""
    preds, target = _as_vector(preds, "preds"), _as_vector(target, "target")
    if preds.shape != target.shape:
        raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} differ")
    result = {
        "mae": mean_absolute_error(preds, target),
        "corr": pearson_corrcoef(preds, target) if preds.numel() > 1 else torch.tensor(float("nan")),
    }
    result["acc2_has0"], result["f1_has0"] = _binary(preds >= 0, target >= 0)
    nonzero = target != 0
    result["acc2_non0"], result["f1_non0"] = _binary(preds[nonzero] > 0, target[nonzero] > 0)
    result["acc7"] = multiclass_accuracy(
        round_to_classes(preds, -3, 3), round_to_classes(target, -3, 3), num_classes=7, average="micro"
    )
    return result


def trait_metrics(
    preds: Tensor, target: Tensor, *, ranges: Sequence[Sequence[float]], names: Sequence[str]
) -> dict[str, Tensor]:
    """POM metrics of (N, k) predictions against (N, k) trait scores.

    ``ranges[i] = (low_i, high_i)``: the integer scale of target i, which sets the
    number of classes of its multi-class accuracy; ``names[i]`` names it in the keys.
    """
    if preds.dim() == 1:
        preds, target = preds[:, None], target[:, None]
    if preds.shape != target.shape or preds.dim() != 2:
        raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} must both be (N, k)")
    if not len(ranges) == len(names) == preds.shape[1]:
        raise ValueError(f"{preds.shape[1]} targets but {len(ranges)} ranges and {len(names)} names")
    result: dict[str, Tensor] = {}
    maes, accuracies, correlations = [], [], []
    for i, ((low, high), name) in enumerate(zip(ranges, names, strict=True)):
        classes = int(round(high) - round(low) + 1)
        if classes < 2:
            raise ValueError(f"target {name!r}: range ({low}, {high}) has fewer than 2 classes")
        p, t = preds[:, i].float(), target[:, i].float()
        mae = mean_absolute_error(p, t)
        accuracy = multiclass_accuracy(
            round_to_classes(p, low, high), round_to_classes(t, low, high),
            num_classes=classes, average="micro",
        )
        result[f"mae/{name}"] = mae
        constant = bool((p == p[0]).all()) or bool((t == t[0]).all())
        result[f"corr/{name}"] = torch.tensor(float("nan")) if constant else pearson_corrcoef(p, t)
        correlations.append(result[f"corr/{name}"])
        result[f"ma{classes}/{name}"] = accuracy
        maes.append(mae)
        accuracies.append(accuracy)
    result["mae"] = torch.stack(maes).mean()
    result["ma"] = torch.stack(accuracies).mean()
    defined = [c for c in correlations if not bool(torch.isnan(c))]
    result["corr"] = torch.stack(defined).mean() if defined else torch.tensor(float("nan"))
    return result


def classification_metrics(preds: Tensor, target: Tensor, *, num_classes: int) -> dict[str, Tensor]:
    """Accuracy and macro F1 of (N, C) scores or (N,) class indices against (N,) classes."""
    if preds.dim() == 2:
        preds = preds.argmax(dim=-1)
    preds, target = preds.long(), target.long()
    return {
        "acc": multiclass_accuracy(preds, target, num_classes=num_classes, average="micro"),
        "f1_macro": multiclass_f1_score(preds, target, num_classes=num_classes, average="macro"),
    }
