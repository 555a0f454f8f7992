"""The choices of MAN's attention side by side: error against cost.

For each way of computing MAN's attention (exact; had with MAN's ARF features, the
LSC vectors estimated with the rest; had with the default centred generalised
features, LSC estimated; the same with the LSC logits exact, the default) and each
number of random features H, one row with

* **attention error**: the relative L2 error of the per-modality attention marginals
  (the estimated weights, summed over the other modalities' steps) against exact's;
* **output error**: |had - exact| / |exact| of the attention output;
* **cost**: forward and forward+backward time of :func:`stacked_multilinear_attention`
  (median of interleaved calls) and the peak memory of a forward+backward;
* **task accuracy**: test accuracy of the demo's MAN (``polyfuse demo``'s planted
  three-way interaction, the same training) built with that choice, when asked, mean
  over seeds; beside it the same trained models evaluated with exact attention (the
  gap a user sees who trains in had mode and evaluates in exact or auto mode).

The inputs are the demo's shapes: m = 3 modalities of lengths 8 / 10 / 12, batch 32, 4
heads, K' = 8 learned features with C = 4 LSC chunks of entry e = 2 appended, K = 8,
temperature 1 / sqrt(K'), features N(0, s^2) with s = 0.5, float64 for the errors
(median over ``seeds`` draws of data and W), float32 for the cost.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from polyfuse.bench.measure import peak_memory_bytes, time_interleaved
from polyfuse.functional import gaussian_random_matrix, stacked_multilinear_attention
from polyfuse.functional.multilinear import attention_marginals

__all__ = ["CHOICES", "Choice", "choice_rows", "format_choice_table"]

LENGTHS = (8, 10, 12)
BATCH, HEADS, FEATURE_DIM, VALUE_DIM, CHUNKS, LSC_SCALE, SCALE = 32, 4, 8, 8, 4, 2.0, 0.5


@dataclass(frozen=True)
class Choice:
    label: str
    mode: str
    estimator: str = "gerf"
    exact_lsc: bool = True
    redraw_in_training: bool = False


CHOICES = (
    Choice("exact", "exact"),
    Choice("had, ARF, LSC estimated", "had", "arf", False),
    Choice("had, gerf, LSC estimated", "had", "gerf", False),
    Choice("had, gerf, LSC exact (default)", "had", "gerf", True),
    # the same attention (errors, cost); trained with fresh random features at every step
    Choice("had, gerf, LSC exact, fresh draws in training", "had", "gerf", True, True),
)


def _inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)
    features = torch.randn(BATCH, HEADS, total, FEATURE_DIM, generator=generator, dtype=dtype) * SCALE
    values = torch.randn(BATCH, HEADS, total, VALUE_DIM, generator=generator, dtype=dtype)
    return features, values


def _matrix(num_features: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(10_000 + seed)
    return torch.stack([gaussian_random_matrix(num_features, FEATURE_DIM + CHUNKS, generator=generator, dtype=dtype)
                        for _ in range(HEADS)])


def _attention(choice: Choice, features, values, matrix, return_attention: bool = False):
    return stacked_multilinear_attention(
        features, values, LENGTHS, mode=choice.mode, random_matrix=matrix, temperature=1 / math.sqrt(FEATURE_DIM),
        estimator=choice.estimator, chunks=CHUNKS, lsc_scale=LSC_SCALE, exact_lsc=choice.exact_lsc,
        return_attention=return_attention)


def _marginals(choice: Choice, features, values, matrix) -> torch.Tensor:
    output, attention = _attention(choice, features, values, matrix, return_attention=True)
    return output, torch.cat(attention_marginals(attention, len(LENGTHS)), -1)


def _errors(choice: Choice, num_features: int, seeds: int) -> tuple[float, float]:
    attention_errors, output_errors = [], []
    for seed in range(seeds):
        features, values = _inputs(seed, torch.float64)
        exact_output, exact_marginals = _marginals(CHOICES[0], features, values, None)
        output, marginals = _marginals(choice, features, values, _matrix(num_features, seed, torch.float64))
        attention_errors.append(float((marginals - exact_marginals).norm() / exact_marginals.norm()))
        output_errors.append(float((output - exact_output).norm() / exact_output.norm()))
    return statistics.median(attention_errors), statistics.median(output_errors)


def _cost(choice: Choice, num_features: int, repeats: int) -> dict[str, float | None]:
    features, values = _inputs(0, torch.float32)
    matrix = _matrix(num_features, 0, torch.float32)
    leaves = [features.clone().requires_grad_(), values.clone().requires_grad_()]

    def forward() -> None:
        with torch.no_grad():
            _attention(choice, features, values, matrix)

    def forward_backward() -> None:
        _attention(choice, *leaves, matrix).sum().backward()

    times = time_interleaved({"forward": forward, "forward_backward": forward_backward}, warmup=2, repeats=repeats)
    peak = peak_memory_bytes(forward_backward, "cpu")
    return {"forward_ms": times["forward"].median * 1e3, "forward_backward_ms": times["forward_backward"].median * 1e3,
            "peak_mb": None if peak is None else peak / 2**20}


def _task_accuracy(
    choice: Choice, num_features: int, epochs: int, seeds: int, num_samples: int = 3000
) -> tuple[float, float | None]:
    """Mean test accuracy of the demo's MAN built with ``choice`` over ``seeds`` seeds, and
    (had only) that of the same trained models evaluated with exact attention."""
    from polyfuse.demo import MAN_OPTIONS, DemoModel, run_demo, test_accuracy

    options = {**MAN_OPTIONS, "mode": choice.mode, "estimator": choice.estimator, "exact_lsc": choice.exact_lsc,
               "num_random_features": num_features, "redraw_in_training": choice.redraw_in_training}
    model = DemoModel(choice.label, "man", options)
    accuracies, exact_accuracies = [], []
    for seed in range(seeds):
        (result,) = run_demo(num_samples=num_samples, epochs=epochs, seed=seed, models=(model,), progress=False,
                             keep_models=True)
        accuracies.append(result.test_accuracy)
        if choice.mode != "exact":
            for layer in result.model.fusion.layers:
                layer.mode = "exact"
            exact_accuracies.append(test_accuracy(result.model, result.test))
    return statistics.mean(accuracies), statistics.mean(exact_accuracies) if exact_accuracies else None


def choice_rows(
    random_features: tuple[int, ...], *, seeds: int = 7, repeats: int = 10, task_epochs: int = 0,
    task_seeds: int = 3, progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per choice and H (one for exact); ``task_epochs`` = 0 leaves the task out."""
    rows = []
    for choice in CHOICES:
        for num_features in (random_features[:1] if choice.mode == "exact" else random_features):
            row: dict[str, Any] = {"choice": choice.label, "random_features": None if choice.mode == "exact"
                                   else num_features}
            row["attention_error"], row["output_error"] = _errors(choice, num_features, seeds)
            row.update(_cost(choice, num_features, repeats))
            row["task_accuracy"], row["task_accuracy_evaluated_exact"] = (
                _task_accuracy(choice, num_features, task_epochs, task_seeds) if task_epochs else (None, None))
            rows.append(row)
            if progress is not None:
                progress(f"{choice.label}, H = {row['random_features']}")
    return rows


def format_choice_table(rows: list[dict[str, Any]]) -> str:
    def number(value: float | None, digits: str) -> str:
        return "–" if value is None else format(value, digits)

    lines = ["| attention | H | attention error | output error | forward ms | fwd+bwd ms | peak MB fwd+bwd "
             "| demo accuracy | evaluated exact |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        accuracy, exact = (None if row[key] is None else 100 * row[key]
                           for key in ("task_accuracy", "task_accuracy_evaluated_exact"))
        lines.append(
            f"| {row['choice']} | {row['random_features'] or '–'} | {row['attention_error']:.3g} "
            f"| {row['output_error']:.3g} | {row['forward_ms']:.2f} | {row['forward_backward_ms']:.2f} "
            f"| {number(row['peak_mb'], '.1f')} | {number(accuracy, '.1f')} | {number(exact, '.1f')} |")
    return "\n".join(lines)
