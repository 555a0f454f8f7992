"""Tables and a figure of a VQA comparison (``polyfuse vqa compare``)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["format_vqa_summary", "plot_vqa_attention", "write_vqa_summary"]


def _mean_std(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def format_vqa_summary(runs: Sequence[Mapping], *, wall_seconds: float | None = None) -> str:
    """Markdown table: per model, VQA accuracy (mean ± sample std over seeds) overall and
    per question type, parameters and mean training time of a run."""
    models = list(dict.fromkeys(r["model"] for r in runs))
    types = sorted({t for r in runs for t in r["per_question_type"]})
    header = ["model", "seeds", "overall", *types, "parameters", "train s / run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model in models:
        mine = [r for r in runs if r["model"] == model]
        row = [model, str(len(mine)), _mean_std([r["overall"] for r in mine])]
        row += [_mean_std([r["per_question_type"][t] for r in mine if t in r["per_question_type"]]) for t in types]
        row += [f"{mine[0]['parameters']:,}", f"{statistics.mean(r['seconds'] for r in mine):.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    if wall_seconds is not None:
        lines.append("")
        lines.append(f"Wall time of the whole comparison: {wall_seconds / 60:.1f} min.")
    return "\n".join(lines)


def write_vqa_summary(runs: Sequence[Mapping], out: str | Path, *, wall_seconds: float | None = None) -> str:
    """Write ``summary.md`` and ``summary.png`` (accuracy per model and question type) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    text = format_vqa_summary(runs, wall_seconds=wall_seconds)
    (out / "summary.md").write_text(text + "\n")
    models = list(dict.fromkeys(r["model"] for r in runs))
    types = ["overall", *sorted({t for r in runs for t in r["per_question_type"]})]
    figure, axis = plt.subplots(figsize=(1.6 + 1.3 * len(models), 3.2))
    width = 0.8 / len(types)
    for offset, kind in enumerate(types):
        means, errors = [], []
        for model in models:
            values = [r["overall"] if kind == "overall" else r["per_question_type"][kind] for r in runs if r["model"] == model]
            means.append(statistics.mean(values))
            errors.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        axis.bar([i + offset * width for i in range(len(models))], means, width, yerr=errors, label=kind, capsize=2)
    axis.set_xticks([i + width * (len(types) - 1) / 2 for i in range(len(models))], models)
    axis.set_ylabel("VQA accuracy (%)")
    low = min(min(r["overall"] for r in runs), *(min(r["per_question_type"].values()) for r in runs))
    axis.set_ylim(max(0.0, low - 10), 100)
    axis.legend(fontsize=7, ncol=len(types), loc="lower right")
    figure.tight_layout()
    figure.savefig(out / "summary.png", dpi=120)
    plt.close(figure)
    return text


def plot_vqa_attention(
    attention, words: Sequence[str], grid: tuple[int, int], image, out: str | Path, *, title: str = ""
) -> Path:
    """One row per glimpse: the image, each glimpse's bilinear attention summed over the
    words and drawn over the image grid, and the attention summed over the grid cells
    per question word (BAN's A_g, paper Eq. 8).

    Args:
        attention: (G, O, L) maps of one question, O = rows * columns grid cells.
        words: the L words (padding included, shown as ``-``).
        grid: (rows, columns) of the image grid.
        image: (H, W, 3) array of the image, or None.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    attention = np.asarray(attention, dtype=float)
    glimpses, objects, length = attention.shape
    rows, columns = grid
    if rows * columns != objects:
        raise ValueError(f"plot_vqa_attention: grid {rows} x {columns} does not hold {objects} objects")
    figure, axes = plt.subplots(glimpses, 2, figsize=(7.5, 2.6 * glimpses), squeeze=False)
    for g in range(glimpses):
        over_image = attention[g].sum(axis=1).reshape(rows, columns)
        left, right = axes[g]
        if image is not None:
            left.imshow(image, extent=(0, 1, 1, 0))
        shown = left.imshow(over_image, extent=(0, 1, 1, 0), alpha=0.55 if image is not None else 1.0, cmap="magma")
        figure.colorbar(shown, ax=left, fraction=0.046)
        left.set_title(f"glimpse {g + 1}: attention over the image grid", fontsize=8)
        left.set_xticks([])
        left.set_yticks([])
        right.barh(range(length), attention[g].sum(axis=0), color="tab:blue")
        right.set_yticks(range(length), list(words), fontsize=7)
        right.invert_yaxis()
        right.set_title(f"glimpse {g + 1}: attention per word", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    out = Path(out)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
