"""``polyfuse bench approximation``: how well had mode approximates the exact attention.

Three measurements, all in float64:

* **Attention output** (docs/BENCHMARKS.md, "Approximation error of had mode"): for m modalities with features
  a_j[t] ~ N(0, s^2 I_8) and values ~ N(0, I_4), the relative error
  |had - exact| / |exact| of :func:`polyfuse.functional.multilinear_attention` with
  W a standard orthogonal Gaussian matrix (H, 8), median over ``seeds`` draws of
  data and W, for MAN's ARF (``estimator="arf"``) and the default centred
  generalised features (``"gerf"``) on the same draws; beside them the theoretical
  relative variance of one tuple's kernel estimate at the mean squared norm of the
  tuples' sums (appendix Eq. 12 for ARF, :func:`gerf_relative_variance` for gerf).
* **Kernel estimate** (appendix Eq. 12, note 4): for m vectors v_j of norm ``scale``,
  the measured mean squared error of the ARF estimate beside Eq. 12's prediction,
  i.i.d. and orthogonal rows.
* **The choices** (:mod:`polyfuse.bench.choices`): exact, had with ARF or gerf with
  the LSC part estimated, and had with the LSC part exact (the default), for a grid of
  H: attention and output error, cost (time and memory, forward and forward+backward)
  and the demo's test accuracy, as one table and a plot of error against cost.
* **A trained model** (:func:`trained_model_errors`): a MAN checkpoint evaluated with
  had (both estimators) and exact attention; task metrics and the relative error of
  the MAN fusion output, had against exact.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from polyfuse.bench.choices import choice_rows, format_choice_table
from polyfuse.bench.measure import LoadMonitor
from polyfuse.bench.results import result_header
from polyfuse.functional import (
    gaussian_random_matrix,
    multilinear_attention,
    positive_random_features,
)
from polyfuse.functional.random_features import gerf_alpha, gerf_relative_variance

__all__ = [
    "FULL",
    "QUICK",
    "ApproximationSettings",
    "attention_errors",
    "kernel_errors",
    "predicted_kernel_mse",
    "run_approximation",
    "trained_model_errors",
]

DOUBLE = torch.float64
# Lengths per number of modalities: the issue's (20, 30, 25) for m = 3; shorter for
# more modalities so that the exact tensor (prod_j T_j entries) stays small.
LENGTHS = {2: (20, 30), 3: (20, 30, 25), 4: (12, 15, 10, 12), 6: (6, 8, 5, 6, 8, 5)}


@dataclass(frozen=True)
class ApproximationSettings:
    modalities: tuple[int, ...] = (2, 3, 4, 6)
    random_features: tuple[int, ...] = (16, 24, 64, 256)
    scales: tuple[float, ...] = (0.3, 0.5, 1.0)
    seeds: int = 7
    feature_dim: int = 8
    value_dim: int = 4
    batch: int = 1
    kernel_random_features: tuple[int, ...] = (16, 64, 256)
    kernel_norms: tuple[float, ...] = (0.3, 0.6)
    kernel_draws: int = 4000
    seed: int = 0
    # The choices table (polyfuse.bench.choices): H grid, timing repeats, and the
    # demo's training per row (epochs; 0 leaves the task out) over task_seeds seeds.
    choice_random_features: tuple[int, ...] = (16, 64, 256)
    choice_repeats: int = 10
    task_epochs: int = 12
    task_seeds: int = 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = ApproximationSettings()
QUICK = ApproximationSettings(
    modalities=(2, 3), random_features=(16, 64), scales=(0.3, 0.5), seeds=3,
    kernel_random_features=(16,), kernel_norms=(0.3,), kernel_draws=200,
    choice_random_features=(16, 64), choice_repeats=3, task_epochs=0,
)


def predicted_kernel_mse(vectors: torch.Tensor, num_features: int) -> float:
    """Appendix Eq. 12: exp(|z|^2) SM^2 (1 - exp(-|z|^2)) / H for i.i.d. rows of W.

    Args:
        vectors: (m, K') the v_j.
    """
    z2 = float(vectors.sum(0).pow(2).sum())
    exact = _kernel(vectors)
    return math.exp(z2) * exact**2 * (1 - math.exp(-z2)) / num_features


def _kernel(vectors: torch.Tensor) -> float:
    """SM({v_j}) = exp(sum_{j<k} v_j . v_k) (MAN Eq. 11; note 1)."""
    pairs = itertools.combinations(range(vectors.shape[0]), 2)
    return math.exp(sum(float(vectors[j] @ vectors[k]) for j, k in pairs))


def _draw_matrices(
    draws: int, num_features: int, dim: int, orthogonal: bool, generator: torch.Generator
) -> torch.Tensor:
    """(draws, H, K') independent random matrices, i.i.d. or orthogonal (blockwise)."""
    if not orthogonal:
        return torch.randn(draws, num_features, dim, generator=generator, dtype=DOUBLE)
    if num_features % dim == 0:  # whole blocks: one batched draw, blocks never straddle matrices
        rows = gaussian_random_matrix(draws * num_features, dim, orthogonal=True, generator=generator,
                                      dtype=DOUBLE)
        return rows.view(draws, num_features, dim)
    return torch.stack([
        gaussian_random_matrix(num_features, dim, orthogonal=True, generator=generator, dtype=DOUBLE)
        for _ in range(draws)
    ])


def kernel_errors(settings: ApproximationSettings, modalities: int = 3) -> list[dict[str, Any]]:
    """Measured MSE of the ARF kernel estimate (i.i.d. and orthogonal) and Eq. 12's prediction."""
    generator = torch.Generator().manual_seed(settings.seed)
    rows = []
    for norm in settings.kernel_norms:
        directions = torch.randn(modalities, settings.feature_dim, generator=generator, dtype=DOUBLE)
        vectors = norm * directions / directions.norm(dim=-1, keepdim=True)
        exact = _kernel(vectors)
        for num_features in settings.kernel_random_features:
            row: dict[str, Any] = {
                "norm": norm, "random_features": num_features, "exact": exact,
                "z_squared": float(vectors.sum(0).pow(2).sum()),
                "predicted_mse_iid": predicted_kernel_mse(vectors, num_features),
            }
            for name, orthogonal in (("iid", False), ("orthogonal", True)):
                matrices = _draw_matrices(settings.kernel_draws, num_features, settings.feature_dim,
                                          orthogonal, generator)
                phi = positive_random_features(vectors.unsqueeze(0), matrices)  # (draws, m, H)
                estimates = phi.prod(dim=1).mean(dim=-1)  # (draws,)
                row[f"measured_mse_{name}"] = float((estimates - exact).pow(2).mean())
                row[f"mean_estimate_{name}"] = float(estimates.mean())
            rows.append(row)
    return rows


def _draw_case(modalities: int, scale: float, num_features: int, seed: int,
               settings: ApproximationSettings) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = LENGTHS.get(modalities) or tuple(itertools.islice(itertools.cycle((6, 8, 5)), modalities))
    features = [torch.randn(settings.batch, t, settings.feature_dim, generator=generator, dtype=DOUBLE) * scale
                for t in lengths]
    values = [torch.randn(settings.batch, t, settings.value_dim, generator=generator, dtype=DOUBLE)
              for t in lengths]
    matrix = gaussian_random_matrix(num_features, settings.feature_dim, orthogonal=True,
                                    generator=generator, dtype=DOUBLE)
    return features, values, matrix


def _mean_squared_sums(features: list[torch.Tensor], centred: bool) -> float:
    """E_t |sum_j a_j[t_j] (- c_j)|^2 over all tuples, uniform weights, first sample:
    sum_j mean |a_j - c_j|^2 + |sum_j c_j|^2 (the last term only when not centred)."""
    means = [a[0].mean(0) for a in features]
    spread = sum(float((a[0] - c).square().sum(-1).mean()) for a, c in zip(features, means, strict=True))
    return spread if centred else spread + float(sum(means).square().sum())


def attention_errors(settings: ApproximationSettings) -> list[dict[str, Any]]:
    """Relative output error of had (ARF and gerf) against exact, per m, H and s."""
    rows = []
    for modalities, scale, num_features in itertools.product(
        settings.modalities, settings.scales, settings.random_features
    ):
        errors: dict[str, list[float]] = {"arf": [], "gerf": []}
        variance: dict[str, list[float]] = {"arf": [], "gerf": []}
        for index in range(settings.seeds):
            seed = settings.seed + 1000 * modalities + index
            features, values, matrix = _draw_case(modalities, scale, num_features, seed, settings)
            exact = multilinear_attention(features, values, mode="exact")
            for estimator in errors:
                estimate = multilinear_attention(features, values, mode="had", random_matrix=matrix,
                                                 estimator=estimator)
                errors[estimator].append(float((estimate - exact).norm() / exact.norm()))
            z2 = _mean_squared_sums(features, centred=False)
            u2 = _mean_squared_sums(features, centred=True)
            alpha = float(gerf_alpha([torch.tensor(u2)], settings.feature_dim))
            variance["arf"].append(math.expm1(z2) / num_features)  # appendix Eq. 12
            variance["gerf"].append(gerf_relative_variance(u2, alpha, settings.feature_dim, num_features))
        row: dict[str, Any] = {"modalities": modalities, "scale": scale, "random_features": num_features}
        for estimator, values_ in errors.items():
            quartiles = statistics.quantiles(values_, n=4) if len(values_) > 1 else [values_[0]] * 3
            row[f"error_{estimator}"] = statistics.median(values_)
            row[f"error_{estimator}_quartiles"] = [quartiles[0], quartiles[2]]
            row[f"kernel_variance_{estimator}"] = statistics.median(variance[estimator])
        row["improvement"] = row["error_arf"] / row["error_gerf"]
        rows.append(row)
    return rows


def format_attention_table(rows: list[dict[str, Any]]) -> str:
    """The attention rows as a Markdown table."""
    lines = ["| m | s | H | error ARF | error gerf | ARF / gerf | kernel rel. variance ARF | gerf |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['modalities']} | {row['scale']} | {row['random_features']} | {row['error_arf']:.3g} | "
            f"{row['error_gerf']:.3g} | {row['improvement']:.2f} | {row['kernel_variance_arf']:.3g} | "
            f"{row['kernel_variance_gerf']:.3g} |"
        )
    return "\n".join(lines)


def run_approximation(
    settings: ApproximationSettings, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    with LoadMonitor() as load:
        attention = attention_errors(settings)
        if progress is not None:
            progress(f"attention output: {len(attention)} points")
        kernel = kernel_errors(settings)
        if progress is not None:
            progress(f"kernel estimate: {len(kernel)} points")
        choices = choice_rows(settings.choice_random_features, seeds=settings.seeds, repeats=settings.choice_repeats,
                              task_epochs=settings.task_epochs, task_seeds=settings.task_seeds,
                              progress=progress) if settings.choice_random_features else []
    payload = result_header("approximation", settings.to_dict())
    payload["load"] = load.result()
    payload["attention"] = attention
    payload["kernel"] = kernel
    payload["choices"] = choices
    payload["table"] = format_attention_table(attention)
    payload["choice_table"] = format_choice_table(choices)
    return payload


def trained_model_errors(checkpoint: str, *, split: str = "test", source: str | None = None) -> dict[str, Any]:
    """A trained MAN checkpoint with had attention (gerf, ARF) and exact attention:
    the task metrics of each and the relative error |had - exact| / |exact| of the MAN
    fusion output over the split (Frobenius norm over all its samples)."""
    from polyfuse.engine import apply_checkpoint, evaluate_applied
    from polyfuse.nn.man import MultiLinearAttentionLayer

    applied = apply_checkpoint(checkpoint, split=split, source=source)
    task = applied.module
    layers = [module for module in task.modules() if isinstance(module, MultiLinearAttentionLayer)]
    if not layers:
        raise ValueError(f"{checkpoint}: no MAN layer in this model")
    (loader,) = applied.loaders().values()
    fusion = layers[-1]  # the last MAN layer's fused output (B, G c)

    def metrics() -> dict[str, float]:
        return evaluate_applied(applied)

    def fused_outputs() -> torch.Tensor:
        captured: list[torch.Tensor] = []
        handle = fusion.register_forward_hook(lambda _m, _i, output: captured.append(
            (output[0] if isinstance(output, tuple) else output).detach().flatten(1)))
        try:
            with torch.no_grad():
                for batch in loader:
                    task.predict_step(batch, 0)
        finally:
            handle.remove()
        return torch.cat(captured)

    result: dict[str, Any] = {"checkpoint": str(checkpoint), "split": split}
    outputs = {}
    trained = [(layer.mode, layer.estimator) for layer in layers]
    try:
        for name, mode, estimator in (("had_gerf", "had", "gerf"), ("had_arf", "had", "arf"), ("exact", "exact", "gerf")):
            for layer in layers:  # each layer passes its own estimator to multilinear_attention
                layer.mode, layer.estimator = mode, estimator
            outputs[name] = fused_outputs()
            result[f"metrics_{name}"] = metrics()
    finally:
        for layer, (mode, estimator) in zip(layers, trained, strict=True):
            layer.mode, layer.estimator = mode, estimator
    norm = float(outputs["exact"].norm())
    for name in ("had_gerf", "had_arf"):
        result[f"relative_error_{name}"] = float((outputs[name] - outputs["exact"]).norm()) / norm
    return result
