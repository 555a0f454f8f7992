"""What the figures of a run show, read from the run (the drawing is :mod:`polyfuse.figures`).

- :func:`plot_learning_curves`: train and validation loss and the monitored
  metric per epoch, from a run's CSV logs (all resumed parts together).
- :func:`attention_for_sample`: for one sample, the marginal attention of each MAN
  input over its time steps (whatever the mode), or BAN's G bilinear attention maps
  (T_x by T_y), for :mod:`polyfuse.figures.attention` to draw.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["attention_for_sample", "plot_learning_curves", "read_epoch_logs"]


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
    """Loss curves (train, validation) and validation metrics per epoch of a run, as a
    PNG (:func:`polyfuse.figures.curves.draw_learning_curves`)."""
    from polyfuse.figures.curves import draw_learning_curves

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
    return draw_learning_curves(epochs, out, metrics=metrics, monitor=monitor, title=run_dir.name)


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
