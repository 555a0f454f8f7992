"""Learning curves: train and validation loss and validation metrics per epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from polyfuse.figures.common import pyplot, save_figure

__all__ = ["curve_metrics", "draw_learning_curves"]


def curve_metrics(keys: Sequence[str], monitor: str | None, *, others: int = 3) -> list[str]:
    """The validation metrics drawn beside the loss when none are named: the monitored
    one first (when logged), then the first ``others`` other ``val/...`` keys but the
    loss, in sorted order."""
    metrics = [k for k in sorted(keys) if k.startswith("val/") and k != "val/loss"]
    first = [monitor] if monitor in metrics else []
    return first + [k for k in metrics if k != monitor][:others]


def draw_learning_curves(
    epochs: Mapping[int, Mapping[str, float]],
    out: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    monitor: str | None = None,
    title: str = "",
) -> Path:
    """One panel of loss (``train/loss``, ``val/loss``) and one per metric, against the
    epoch, from ``{epoch: {logged key: value}}`` (Lightning's 0-based epochs, drawn
    1-based on integer ticks as the command line counts them: "epoch 2 of 2");
    ``monitor`` is marked in its title."""
    from matplotlib.ticker import MaxNLocator

    if metrics is None:
        metrics = curve_metrics(list({k for values in epochs.values() for k in values}), monitor)
    plt = pyplot()
    panels = 1 + len(metrics)
    figure, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), squeeze=False)
    order = sorted(epochs)
    for key in ("train/loss", "val/loss"):
        points = [(e + 1, epochs[e][key]) for e in order if key in epochs[e]]
        if points:
            axes[0, 0].plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
    axes[0, 0].set_title("loss")
    axes[0, 0].legend()
    for axis, key in zip(axes[0, 1:], metrics, strict=False):
        points = [(e + 1, epochs[e][key]) for e in order if key in epochs[e]]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", markersize=3)
        axis.set_title(key + (" (monitor)" if key == monitor else ""))
    for axis in axes[0]:
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return save_figure(figure, out, dpi=110)
