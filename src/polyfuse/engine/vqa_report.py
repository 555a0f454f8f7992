"""A VQA comparison's table and figure (``polyfuse compare`` on a ``task.type: vqa``
configuration) and the attention figure of ``polyfuse plot attention``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["format_vqa_summary", "plot_vqa_attention", "plot_vqa_summary", "vqa_types"]


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
    """Bars of test accuracy (%) per model, overall and per type, with ± std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [str(row["model"]) for row in summary]
    keys = ["acc", *(f"acc/{t}" for t in vqa_types(summary))]
    figure, axis = plt.subplots(figsize=(1.6 + 1.3 * len(models), 3.2))
    width = 0.8 / len(keys)
    low = 100.0
    for offset, key in enumerate(keys):
        means = [100 * row.get(f"{key}_mean", float("nan")) for row in summary]
        errors = [100 * row.get(f"{key}_std", 0.0) for row in summary]
        low = min(low, *means)
        label = "overall" if key == "acc" else key.split("/", 1)[1]
        axis.bar([i + offset * width for i in range(len(models))], means, width, yerr=errors, label=label, capsize=2)
    axis.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(models))], models)
    axis.set_ylabel("VQA accuracy (%)")
    axis.set_ylim(max(0.0, low - 10), 100)
    axis.legend(fontsize=7, ncol=len(keys), loc="lower right")
    figure.tight_layout()
    out = Path(out)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


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
