"""The tables of a comparison of ranking models (``polyfuse compare`` over retrieval or
Chimera configurations; docs/RESULTS.md): EX1, the test split's captions as written, and
EX2, the same captions with their words shuffled (``test_shuffled_words`` of each run's
results.json), one row per model (``n``: its seeds), mean ± sample std over the seeds, after a row of the
chance recalls and, on synthetic data, the two reference bounds."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["METRIC_COLUMNS", "comparison_runs", "metrics_table", "ranking_tables"]

#: The columns of the tables.
METRIC_COLUMNS = ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR", "v2t_R@1", "v2t_R@5", "v2t_R@10", "v2t_MedR")
_BOUNDS = (("caption_", "bound: perfect caption match"), ("events_", "bound: events known, relation not"))


def _mean_std(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def comparison_runs(out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The results.json of every run of a comparison, by model, in the order of its
    ``runs.csv`` (``<out_dir>/<model>/seed<N>/results.json``)."""
    from polyfuse.data.formats.jsonfile import read_json

    with (Path(out_dir) / "runs.csv").open(newline="") as handle:
        listed = [(row["model"], row["seed"]) for row in csv.DictReader(handle)]
    rows: dict[str, list[dict[str, Any]]] = {}
    for model, seed in listed:
        path = Path(out_dir) / model / f"seed{seed}" / "results.json"
        results = read_json(path)
        if not isinstance(results, dict) or not isinstance(results.get("test"), dict) or not results["test"]:
            raise ValueError(f"{path}: no test metrics")
        rows.setdefault(model, []).append(results)
    return rows


def metrics_table(rows: Mapping[str, Sequence[Mapping[str, Any]]], key: str = "test") -> str:
    """Markdown: a row per model of the ``key`` metrics (``test`` or ``test_shuffled_words``),
    mean ± std over its runs; the chance recalls and (synthetic data) the bounds first."""
    lines = ["| model | " + " | ".join(METRIC_COLUMNS) + " | train s/seed |", "|" + "---|" * (len(METRIC_COLUMNS) + 2)]
    first = next(iter(rows.values()))[0]
    chance = [f"{first['test']['chance_' + c]:.1f}" if "chance_" + c in first["test"] else "-" for c in METRIC_COLUMNS]
    lines.append("| chance | " + " | ".join(chance) + " | - |")
    references = first.get("references", {})
    for prefix, label in _BOUNDS:
        if any(name.startswith(prefix) for name in references):
            cells = [f"{references[prefix + c[4:]]:.1f}" if c.startswith("t2v_R@") else "-" for c in METRIC_COLUMNS]
            lines.append(f"| {label} | " + " | ".join(cells) + " | - |")
    for name, runs in rows.items():
        if any(key not in run for run in runs):
            continue
        cells = [_mean_std([run[key][c] for run in runs]) for c in METRIC_COLUMNS]
        seconds = statistics.mean(run["train_seconds"] for run in runs)
        lines.append(f"| {name} (n={len(runs)}) | " + " | ".join(cells) + f" | {seconds:.0f} |")
    return "\n".join(lines)


def ranking_tables(out_dir: Path) -> str:
    """EX1 and, where the runs ranked the shuffled captions, EX2 of a comparison."""
    rows = comparison_runs(out_dir)
    text = "EX1 (captions as written)\n\n" + metrics_table(rows)
    if any("test_shuffled_words" in run for runs in rows.values() for run in runs):
        text += "\n\nEX2 (words of each caption shuffled)\n\n" + metrics_table(rows, "test_shuffled_words")
    return text
