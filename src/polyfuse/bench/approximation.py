"""``polyfuse bench approximation``: how well had mode approximates the exact attention.

Two measurements, both in float64:

* **Kernel estimate** (appendix Eq. 12, note 4 of the papers' README): for m vectors
  v_j of norm ``scale`` in random directions, the H-feature estimate
  (1/H) sum_h prod_j phi(v_j)_h of SM = exp(sum_{j<k} v_j . v_k) is drawn
  ``draws`` times; its measured mean squared error is set beside the prediction
  exp(|z|^2) SM^2 (1 - exp(-|z|^2)) / H (z = sum_j v_j) for i.i.d. Gaussian rows of
  W, and measured for orthogonal rows (appendix G; no closed form, it should do no
  worse).
* **Attention output**: the relative error |had - exact| / |exact| (Frobenius norm
  over a batch) of :func:`polyfuse.functional.multilinear_attention`, against H, for
  features scaled so that their norm is about ``scale``, averaged over draws of W.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from polyfuse.bench.measure import LoadMonitor
from polyfuse.bench.results import result_header
from polyfuse.functional import (
    gaussian_random_matrix,
    multilinear_attention,
    positive_random_features,
)

__all__ = [
    "FULL",
    "QUICK",
    "ApproximationSettings",
    "attention_errors",
    "kernel_errors",
    "predicted_kernel_mse",
    "run_approximation",
]

DOUBLE = torch.float64


@dataclass(frozen=True)
class ApproximationSettings:
    random_features: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    scales: tuple[float, ...] = (0.3, 0.6, 0.9)
    modalities: int = 3
    feature_dim: int = 8
    kernel_draws: int = 4000
    attention_draws: int = 20
    lengths: tuple[int, ...] = (6, 8, 10)
    value_dim: int = 4
    batch: int = 8
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = ApproximationSettings()
QUICK = ApproximationSettings(
    random_features=(16, 64), scales=(0.3, 0.6), kernel_draws=200, attention_draws=3,
    lengths=(3, 4, 5), batch=2,
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
        rows = gaussian_random_matrix(
            draws * num_features, dim, orthogonal=True, generator=generator, dtype=DOUBLE
        )
        return rows.view(draws, num_features, dim)
    return torch.stack([
        gaussian_random_matrix(num_features, dim, orthogonal=True, generator=generator, dtype=DOUBLE)
        for _ in range(draws)
    ])


def kernel_errors(settings: ApproximationSettings) -> list[dict[str, Any]]:
    """Measured MSE of the kernel estimate (i.i.d. and orthogonal) and Eq. 12's prediction."""
    generator = torch.Generator().manual_seed(settings.seed)
    rows = []
    for scale in settings.scales:
        directions = torch.randn(settings.modalities, settings.feature_dim, generator=generator, dtype=DOUBLE)
        vectors = scale * directions / directions.norm(dim=-1, keepdim=True)
        exact = _kernel(vectors)
        z2 = float(vectors.sum(0).pow(2).sum())
        for num_features in settings.random_features:
            row: dict[str, Any] = {
                "scale": scale, "random_features": num_features, "exact": exact, "z_squared": z2,
                "predicted_mse_iid": predicted_kernel_mse(vectors, num_features),
            }
            for name, orthogonal in (("iid", False), ("orthogonal", True)):
                squared, total = 0.0, 0.0
                chunk = max(1, min(settings.kernel_draws, 2**22 // (num_features * settings.feature_dim)))
                done = 0
                while done < settings.kernel_draws:
                    count = min(chunk, settings.kernel_draws - done)
                    matrices = _draw_matrices(count, num_features, settings.feature_dim, orthogonal, generator)
                    phi = positive_random_features(vectors.unsqueeze(0), matrices)  # (draws, m, H)
                    estimates = phi.prod(dim=1).mean(dim=-1)  # (draws,)
                    squared += float((estimates - exact).pow(2).sum())
                    total += float(estimates.sum())
                    done += count
                row[f"measured_mse_{name}"] = squared / settings.kernel_draws
                row[f"mean_estimate_{name}"] = total / settings.kernel_draws
            rows.append(row)
    return rows


def attention_errors(settings: ApproximationSettings) -> list[dict[str, Any]]:
    """Relative error of had against exact attention, per scale, H and feature type."""
    generator = torch.Generator().manual_seed(settings.seed + 1)
    lengths = settings.lengths[: settings.modalities]
    if len(lengths) < settings.modalities:
        lengths = lengths + (lengths[-1],) * (settings.modalities - len(lengths))
    rows = []
    for scale in settings.scales:
        features = [
            torch.randn(settings.batch, t, settings.feature_dim, generator=generator, dtype=DOUBLE)
            * (scale / math.sqrt(settings.feature_dim))
            for t in lengths
        ]
        values = [torch.randn(settings.batch, t, settings.value_dim, generator=generator, dtype=DOUBLE)
                  for t in lengths]
        exact = multilinear_attention(features, values, mode="exact")
        norm = float(exact.norm())
        for num_features in settings.random_features:
            row: dict[str, Any] = {"scale": scale, "random_features": num_features}
            for name, orthogonal in (("iid", False), ("orthogonal", True)):
                errors = []
                for _ in range(settings.attention_draws):
                    matrix = gaussian_random_matrix(
                        num_features, settings.feature_dim, orthogonal=orthogonal,
                        generator=generator, dtype=DOUBLE,
                    )
                    estimate = multilinear_attention(features, values, mode="had", random_features=matrix)
                    errors.append(float((estimate - exact).norm()) / norm)
                mean = sum(errors) / len(errors)
                spread = math.sqrt(sum((e - mean) ** 2 for e in errors) / max(len(errors) - 1, 1))
                row[f"relative_error_{name}"] = mean
                row[f"relative_error_{name}_std"] = spread
            rows.append(row)
    return rows


def run_approximation(
    settings: ApproximationSettings, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    with LoadMonitor() as load:
        kernel = kernel_errors(settings)
        if progress is not None:
            progress(f"kernel estimate: {len(kernel)} points")
        attention = attention_errors(settings)
        if progress is not None:
            progress(f"attention output: {len(attention)} points")
    payload = result_header("approximation", settings.to_dict())
    payload["load"] = load.result()
    payload["kernel"] = kernel
    payload["attention"] = attention
    return payload
