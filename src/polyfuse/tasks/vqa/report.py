"""A VQA comparison's table and figure (``polyfuse compare`` on a ``task.type: vqa``
configuration, through :meth:`polyfuse.tasks.vqa.spec.VQASpec.summary`); the figure is drawn
by :func:`polyfuse.figures.vqa.draw_vqa_summary`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["format_vqa_summary", "plot_vqa_summary", "vqa_types"]


def vqa_types(summary: Sequence[Mapping]) -> list[str]:
    """The type names of the breakdown (``acc/<type>`` test keys), in order of appearance."""
    keys = [k[: -len("_mean")] for row in summary for k in row if k.startswith("acc/") and k.endswith("_mean")]
    return [k.split("/", 1)[1] for k in dict.fromkeys(keys)]


def _cell(row: Mapping, key: str) -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std", 0.0)
    return "–" if mean is None else f"{100 * mean:.2f} ± {100 * std:.2f}"


def format_vqa_summary(summary: Sequence[Mapping]) -> str:
    """Markdown: per model (rows of :func:`polyfuse.engine.compare.summarise`), the VQA
    accuracy in % (mean ± sample std over seeds) on validation (which picked each run's
    checkpoint) and on test, overall and per type; epochs and seconds per run."""
    types = vqa_types(summary)
    header = ["model", "runs", "val acc", "test acc", *types, "epochs", "s / run"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in summary:
        cells = [str(row["model"]), str(row["runs"]), _cell(row, "val_acc"), _cell(row, "acc")]
        cells += [_cell(row, f"acc/{t}") for t in types]
        cells += [f"{row.get('epochs_mean', float('nan')):.1f}", f"{row.get('seconds_mean', float('nan')):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_vqa_summary(summary: Sequence[Mapping], out: str | Path) -> Path:
    """Bars of test accuracy (%) per model, overall and per type, with ± std error bars
    (:func:`polyfuse.figures.vqa.draw_vqa_summary`)."""
    from polyfuse.figures.vqa import draw_vqa_summary

    return draw_vqa_summary(summary, vqa_types(summary), out)
