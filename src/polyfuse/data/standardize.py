"""Per-feature standardisation with statistics of the training rows only.

:func:`fit_stats` computes them over one array of the training rows; :class:`StreamingStats`
over the same rows given a block at a time, in float64, for training rows too large to
hold at once (:mod:`polyfuse.data.prepare` says which is used when).

Shapes: ``N`` rows, ``T`` steps, ``d`` features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FeatureStats", "StreamingStats", "fit_stats", "real_steps"]


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
    return _finish(mean, variance)


def _finish(mean: np.ndarray, variance: np.ndarray) -> FeatureStats:
    std = np.sqrt(variance)
    std[std < 1e-8 * np.maximum(1.0, np.abs(mean))] = 1.0
    return FeatureStats(mean.astype(np.float32), std.astype(np.float32))


class StreamingStats:
    """The statistics of :func:`fit_stats` from blocks of rows, one pass, float64.

    Each block's count, mean and sum of squared deviations are merged into the running
    ones (Chan, Golub and LeVeque's pairwise update), so the result is that of
    :func:`fit_stats` up to rounding, whatever the blocks."""

    def __init__(self, features: int) -> None:
        self.count = np.zeros(features)
        self.mean = np.zeros(features)
        self.squares = np.zeros(features)  # sum of squared deviations from the mean

    def add(self, block: np.ndarray, lengths: np.ndarray) -> None:
        """Add the real steps of ``block`` (n, T, d) with ``lengths`` (n,); NaN skipped."""
        selected = block[real_steps(lengths, block.shape[1])].astype(np.float64)  # (n_steps, d)
        observed = np.isfinite(selected)
        count = observed.sum(axis=0)
        mean = np.divide(np.where(observed, selected, 0.0).sum(axis=0), count, out=np.zeros_like(self.mean), where=count > 0)
        squares = (np.where(observed, selected - mean, 0.0) ** 2).sum(axis=0)
        total = self.count + count
        share = np.divide(count, total, out=np.zeros_like(self.mean), where=total > 0)
        delta = mean - self.mean
        self.squares += squares + delta**2 * self.count * share
        self.mean += delta * share
        self.count = total

    def result(self) -> FeatureStats:
        variance = np.divide(self.squares, self.count, out=np.zeros_like(self.mean), where=self.count > 0)
        return _finish(self.mean, variance)
