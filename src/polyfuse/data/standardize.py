"""Per-feature standardisation with statistics of the training rows only.

Shapes: ``N`` rows, ``T`` steps, ``d`` features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FeatureStats", "fit_stats", "real_steps"]


def real_steps(lengths: np.ndarray, steps: int) -> np.ndarray:
    """(N, T) bool, True at the first ``lengths[i]`` steps of row i."""
    return np.arange(steps)[None, :] < lengths[:, None]


@dataclass
class FeatureStats:
    """Mean and standard deviation per feature, (d,) float32 each."""

    mean: np.ndarray
    std: np.ndarray

    def apply(self, features: np.ndarray) -> np.ndarray:
        """(N, T, d) -> (N, T, d) float32, ``(x - mean) / std``."""
        return ((features - self.mean) / self.std).astype(np.float32)


def fit_stats(features: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> FeatureStats:
    """Statistics over the real steps of ``rows`` (NaN entries are skipped).

    Args:
        features: (N, T, d).
        lengths: (N,) real steps per row.
        rows: the training rows.

    A feature that is constant there gets std 1 (it becomes 0 everywhere, never
    a division by zero); one never observed gets mean 0 and std 1.
    """
    selected = features[rows][real_steps(lengths[rows], features.shape[1])]  # (n_steps, d)
    selected = selected.astype(np.float64)
    observed = np.isfinite(selected)
    count = observed.sum(axis=0)
    safe = np.where(observed, selected, 0.0)
    mean = np.divide(safe.sum(axis=0), count, out=np.zeros(selected.shape[1]), where=count > 0)
    centred = np.where(observed, selected - mean, 0.0)
    variance = np.divide((centred**2).sum(axis=0), count, out=np.zeros(selected.shape[1]), where=count > 0)
    std = np.sqrt(variance)
    std[std < 1e-8 * np.maximum(1.0, np.abs(mean))] = 1.0
    return FeatureStats(mean.astype(np.float32), std.astype(np.float32))
