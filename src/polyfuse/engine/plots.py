"""Plots (PNG, matplotlib): learning curves, MAN attention over time, BAN maps.

- :func:`plot_learning_curves`: train and validation loss and the monitored
  metric per epoch, from a run's CSV logs (all resumed parts together).
- :func:`plot_man_attention`: for one sample, the had-mode marginal attention of
  each fusion input over its time steps (MAN's per-modality marginals), one row
  of heads per input, for every layer.
- :func:`plot_ban_maps`: for one sample, BAN's G bilinear attention maps
  (T_x by T_y).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["attention_for_sample", "plot_ban_maps", "plot_learning_curves", "plot_man_attention", "read_epoch_logs"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_epoch_logs(run_dir: str | Path) -> dict[int, dict[str, float]]:
    """Per-epoch logged values of a run, merged over its CSV log versions (later parts win)."""
    run_dir = Path(run_dir)
    files = sorted((run_dir / "csv").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[-1]))
    if not files:
        raise ValueError(f"no CSV logs under {run_dir / 'csv'}")
    epochs: dict[int, dict[str, float]] = {}
    for path in files:
        with path.open() as handle:
            for record in csv.DictReader(handle):
                if not record.get("epoch"):
                    continue
                epoch = int(float(record["epoch"]))
                values = {k: float(v) for k, v in record.items() if v not in ("", None) and k not in ("epoch", "step")}
                epochs.setdefault(epoch, {}).update(values)
    return epochs


def plot_learning_curves(run_dir: str | Path, out: str | Path, *, metrics: Sequence[str] | None = None) -> Path:
    """Loss curves (train, validation) and validation metrics per epoch, as a PNG."""
    run_dir = Path(run_dir)
    epochs = read_epoch_logs(run_dir)
    monitor = None
    results = run_dir / "results.json"
    if results.is_file():
        summary = json.loads(results.read_text())
        monitor = summary.get("monitor")
        # The final validation and test of the best checkpoint are logged one epoch
        # after the last trained one: they are not points of the curves.
        epochs = {e: v for e, v in epochs.items() if e < summary.get("epochs", e + 1)}
    keys = sorted({k for values in epochs.values() for k in values})
    if metrics is None:
        metrics = [k for k in keys if k.startswith("val/") and k != "val/loss"]
        metrics = ([monitor] if monitor in metrics else []) + [k for k in metrics if k != monitor][:3]
    plt = _pyplot()
    panels = 1 + len(metrics)
    figure, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), squeeze=False)
    order = sorted(epochs)
    for key in ("train/loss", "val/loss"):
        points = [(e, epochs[e][key]) for e in order if key in epochs[e]]
        if points:
            axes[0, 0].plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
    axes[0, 0].set_title("loss")
    axes[0, 0].legend()
    for axis, key in zip(axes[0, 1:], metrics, strict=False):
        points = [(e, epochs[e][key]) for e in order if key in epochs[e]]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", markersize=3)
        axis.set_title(key + (" (monitor)" if key == monitor else ""))
    for axis in axes[0]:
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
    figure.suptitle(run_dir.name)
    figure.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


@torch.no_grad()
def attention_for_sample(task: Any, batch: dict[str, Any]) -> dict[str, Any]:
    """The attention of the fusion module of ``task`` for a one-sample batch.

    Returns ``{"kind": "man", "layers": [[(heads, T_j) per input] per layer]}`` for
    MAN (the marginal attention of each input, whatever the mode), ``{"kind": "ban", "maps": (G, T_x, T_y)}`` for BAN, with the
    input names and real lengths.
    """
    from polyfuse.functional.multilinear import attention_marginals
    from polyfuse.nn import BAN, MAN

    task.eval()
    backbone = task.backbone
    encoded = backbone.encode(batch["inputs"], batch["masks"])
    inputs, masks = backbone.fusion_inputs(encoded, batch["masks"])
    lengths = [int(m[0].sum()) for m in masks]
    names = backbone.group_names()
    fusion = backbone.fusion
    if isinstance(fusion, MAN):
        output = fusion(inputs, masks, return_details=True)
        layers = [[a[0, :, :length].float().numpy()
                   for a, length in zip(attention_marginals(layer, len(lengths)), lengths, strict=True)]
                  for layer in output.attention]
        return {"kind": "man", "layers": layers, "names": names, "lengths": lengths}
    if isinstance(fusion, BAN):
        maps = fusion(inputs, masks, return_details=True).attention
        return {"kind": "ban", "maps": maps[0, :, : lengths[0], : lengths[1]].float().numpy(), "names": names, "lengths": lengths}
    raise ValueError(f"no attention plot for fusion {type(fusion).__name__}; MAN and BAN have one")


def plot_man_attention(attention: dict[str, Any], out: str | Path, *, title: str = "", centre: int | None = None) -> Path:
    """Heat maps heads x time steps of each input's marginal attention, per layer."""
    layers, names = attention["layers"], attention["names"]
    plt = _pyplot()
    rows, columns = len(layers), len(names)
    figure, axes = plt.subplots(rows, columns, figsize=(3.8 * columns, 2.4 * rows + 0.6), squeeze=False)
    for i, layer in enumerate(layers):
        for j, (weights, name) in enumerate(zip(layer, names, strict=True)):
            axis = axes[i, j]
            image = axis.imshow(weights, aspect="auto", cmap="viridis", interpolation="nearest")
            axis.set_title(f"{name}" + (f" (layer {i})" if rows > 1 else ""))
            axis.set_xlabel("time step")
            axis.set_ylabel("head")
            if centre is not None and centre < weights.shape[1]:
                axis.axvline(centre, color="white", linestyle="--", linewidth=1)
            figure.colorbar(image, ax=axis, fraction=0.046)
    figure.suptitle(title or "MAN marginal attention over time")
    figure.tight_layout()
    return _save(figure, plt, out)


def plot_ban_maps(attention: dict[str, Any], out: str | Path, *, title: str = "") -> Path:
    """One heat map T_x by T_y per glimpse."""
    maps, names = attention["maps"], attention["names"]
    plt = _pyplot()
    glimpses = maps.shape[0]
    figure, axes = plt.subplots(1, glimpses, figsize=(3.4 * glimpses, 3.2), squeeze=False)
    for g in range(glimpses):
        axis = axes[0, g]
        image = axis.imshow(np.asarray(maps[g]), aspect="auto", cmap="magma", interpolation="nearest")
        axis.set_title(f"glimpse {g}")
        axis.set_xlabel(f"{names[1]} step")
        axis.set_ylabel(f"{names[0]} step")
        figure.colorbar(image, ax=axis, fraction=0.046)
    figure.suptitle(title or "BAN bilinear attention maps")
    figure.tight_layout()
    return _save(figure, plt, out)


def _save(figure: Any, plt: Any, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
