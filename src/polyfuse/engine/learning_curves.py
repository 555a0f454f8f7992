"""The learning curves of a run, read from the run (the drawing is
:mod:`polyfuse.figures.curves`): train and validation loss and the monitored metric per
epoch, from a run's CSV logs (all resumed parts together). The attention figures of a
checkpoint are the tasks' (:meth:`polyfuse.tasks.registry.TaskSpec.attention_figures`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["plot_learning_curves", "read_epoch_logs"]


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
