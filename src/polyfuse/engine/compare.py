"""Several models, several seeds, one table of mean and standard deviation.

Every model is trained ``seeds`` times with seeds ``seed, seed + 1, ...`` (the
data splits stay fixed by ``data.split_seed``), each run testing its best
validation checkpoint once. The table gives, per model and metric, the mean and
the sample standard deviation (ddof = 1) over seeds of the validation monitor
(what picked each run's checkpoint) and of the test metrics, and the mean wall
time of a run; regression tasks add the test metrics of constant predictions:
the training median of each target (the best constant for MAE) and the training
mean (the best constant for MSE), one row each where they differ. Written beside
the runs: ``runs.csv`` (one line per run), ``summary.csv``, ``summary.md`` and, for
regression, ``baseline.json`` (row name -> test metrics).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polyfuse.nn
from polyfuse.atomic import atomic_write_text, write_csv
from polyfuse.engine.build import monitor_of
from polyfuse.engine.config import deep_merge, load_config, resolve_config
from polyfuse.engine.run import train
from polyfuse.tasks.registry import task_spec, task_specs

__all__ = [
    "CONSTANT_ROWS",
    "ModelEntry",
    "compare",
    "constant_baseline",
    "constant_baselines",
    "format_summary",
    "parse_models",
    "summarise",
]

#: the row names of the constant predictions, by the training statistic predicted
CONSTANT_ROWS = {"median": "constant (train median)", "mean": "constant (train mean)"}

# Column order and headers for the MOSI metrics; other tasks list their keys as they come.
_HEADERS = {
    "mae": "MAE",
    "corr": "Corr",
    "acc2_has0": "Acc2 has-0",
    "f1_has0": "F1 has-0",
    "acc2_non0": "Acc2 non-0",
    "f1_non0": "F1 non-0",
    "acc7": "Acc7",
    "acc": "Acc",
    "f1_macro": "F1 macro",
    "ma": "MA",
}


def model_sections() -> tuple[str, ...]:
    """The sections a model entry's YAML replaces: ``model``, ``optim`` and every section
    a task type names as defining its weights (``TaskSpec.model_sections``: captioning's
    ``decoder``, retrieval's ``retrieval``, Chimera's ``chimera``)."""
    named = (section for spec in task_specs() for section in spec.model_sections)
    return tuple(dict.fromkeys(("model", "optim", *named)))


_PERCENT = {"acc2_has0", "f1_has0", "acc2_non0", "f1_non0", "acc7", "acc", "f1_macro", "ma"}


@dataclass
class ModelEntry:
    """One line of the table: a label and the configuration changes it makes."""

    label: str
    update: dict[str, Any]


def parse_models(spec: str | Sequence[str]) -> list[ModelEntry]:
    """``man,ban,...`` (fusion names: switch ``model.fusion``) or YAML paths (their
    ``model`` and ``optim`` sections, and the sections that define a task's model,
    :func:`model_sections`, merged over the base; labelled by file name), comma-separated.
    Data, task and trainer always come from the base, so that every model is run the
    same way (retrieval and Chimera name their data in their own section: give the
    entries the base's)."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items:
        raise ValueError("--models names no model")
    entries = []
    for item in items:
        if item.endswith((".yaml", ".yml")):
            loaded = load_config(item)
            update = {key: loaded[key] for key in model_sections() if key in loaded}
            entries.append(ModelEntry(Path(item).stem, update))
        else:
            own = sorted({name for spec in task_specs() for name in (spec.fusions or ())})
            if item not in own:  # a task type's own fusion (retrieval's video fusions) is checked with the task
                polyfuse.nn.get(item)  # an unknown name lists the known ones
            entries.append(ModelEntry(item, {"model": {"fusion": item}}))
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--models names a model twice: {labels}")
    return entries


def compare(
    base: Mapping[str, Any],
    models: Sequence[ModelEntry],
    *,
    seeds: int = 5,
    out_dir: str | Path,
    progress: Any = print,
) -> list[dict[str, Any]]:
    """Train every model with every seed; write and return the per-run records."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    base = resolve_config(base)
    if base["trainer"]["devices"] != 1 or base["trainer"]["num_nodes"] != 1:
        raise ValueError("compare trains one run after another in one process: use trainer.devices=1 and "
                         "trainer.num_nodes=1 (train each model with polyfuse train for several processes)")
    for entry in models:  # every entry's configuration is checked before anything trains
        resolve_config(deep_merge(base, entry.update))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    for entry in models:
        for offset in range(seeds):
            config = deep_merge(base, entry.update)
            config["seed"] = int(base["seed"]) + offset
            config = resolve_config(config)
            run_dir = out_dir / entry.label / f"seed{config['seed']}"
            result = train(config, run_dir=run_dir)
            record = {
                "model": entry.label,
                "seed": config["seed"],
                "epochs": result.epochs,
                "seconds": round(result.train_seconds, 2),
                **{f"val_{k}": v for k, v in result.validation.items()},
                **result.test,
            }
            records.append(record)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in result.test.items() if "/" not in k)
            trained = f"best epoch {result.best_epoch} of {result.epochs}" if result.best_epoch else f"{result.epochs} epochs"
            progress(f"{entry.label} seed {config['seed']}: {shown} ({result.train_seconds:.1f} s, {trained})")
            write_csv(out_dir / "runs.csv", records)
    monitor = monitor_of(base)[0].replace("/", "_")  # val/mae -> val_mae
    summary = summarise(records, validation_key=monitor)
    write_csv(out_dir / "summary.csv", summary)
    baseline = constant_baselines(base)
    if baseline:
        atomic_write_text(out_dir / "baseline.json", json.dumps(baseline, indent=2) + "\n")
    own = task_spec(base["task"]["type"]).summary(summary, out_dir)  # e.g. VQA: accuracy per type, a figure
    atomic_write_text(out_dir / "summary.md", (own if own is not None else format_summary(summary, baseline)) + "\n")
    atomic_write_text(out_dir / "base_config.json", json.dumps(base, indent=2) + "\n")
    return records


def _metric_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    skip = {"model", "seed", "epochs", "seconds"}
    keys: list[str] = []
    for record in records:
        for key in record:
            if key not in skip and not key.startswith("val_") and key not in keys:
                keys.append(key)
    known = [k for k in _HEADERS if k in keys]
    return known + [k for k in keys if k not in known and k != "loss"]


def summarise(records: Sequence[Mapping[str, Any]], *, validation_key: str | None = None) -> list[dict[str, Any]]:
    """Mean and sample standard deviation per model and metric.

    ``validation_key`` (e.g. ``val_mae``, the monitor that picked each run's
    checkpoint) comes first, then the test metrics, then seconds and epochs.
    """
    keys = _metric_keys(records)
    if validation_key and any(validation_key in r for r in records):
        keys = [validation_key, *keys]
    rows = []
    for model in dict.fromkeys(r["model"] for r in records):
        runs = [r for r in records if r["model"] == model]
        row: dict[str, Any] = {"model": model, "runs": len(runs)}
        for key in [*keys, "seconds", "epochs"]:
            values = [float(r[key]) for r in runs if key in r]
            row[f"{key}_mean"] = statistics.fmean(values) if values else float("nan")
            row[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def _is_percent(key: str) -> bool:
    """Accuracies and F1 (``acc7``, ``ma7/<trait>``, ...) are shown in %, everything else as is."""
    family = key.removeprefix("val_").split("/")[0]
    return family in _PERCENT or bool(re.fullmatch(r"ma\d+", family))


def _cell(row: Mapping[str, Any], key: str) -> str:
    mean, std = row.get(f"{key}_mean", float("nan")), row.get(f"{key}_std", 0.0)
    if math.isnan(mean):
        return "–"
    scale, digits = (100.0, 1) if _is_percent(key) else (1.0, 3)
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def _label(row: Mapping[str, Any]) -> str:
    return f"{row['model']} (n={row['runs']})" if row.get("runs") else str(row["model"])


def format_summary(
    summary: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any] | None = None
) -> str:
    """Markdown: one table of mean ± std per averaged metric (accuracies and F1 in %,
    the rest as fractions or label units); a ``val_`` column is the validation
    monitor, all others are test metrics. Per-target metrics (``mae/<trait>``, ...)
    follow in one table per metric, a column per target. ``baseline`` (row name ->
    test metrics of a constant prediction, see :func:`constant_baselines`; or one
    metrics dict, the training mean's) gives the last rows."""
    if not summary:
        return "(no runs)"
    keys = [k[: -len("_mean")] for k in summary[0] if k.endswith("_mean") and k not in ("seconds_mean", "epochs_mean")]
    rows = list(summary)
    if baseline and not all(isinstance(v, Mapping) for v in baseline.values()):
        baseline = {CONSTANT_ROWS["mean"]: baseline}
    for name, metrics in (baseline or {}).items():
        rows.append({"model": name, **{f"{k}_mean": v for k, v in metrics.items()}})
    overall = [k for k in keys if "/" not in k]
    headers = ["model", *(_header(k) for k in overall), "s / run"]
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    for row in rows:
        cells = [_label(row), *(_cell(row, k) for k in overall)]
        cells.append(f"{row['seconds_mean']:.0f}" if "seconds_mean" in row else "–")
        lines.append("| " + " | ".join(cells) + " |")
    families = list(dict.fromkeys(k.split("/")[0] for k in keys if "/" in k))
    for family in families:
        targets = [k for k in keys if "/" in k and k.split("/")[0] == family]
        unit = " (%)" if _is_percent(family) else ""
        lines += ["", f"Per target: {_header(family)}{unit}", ""]
        lines += ["| model | " + " | ".join(k.split("/", 1)[1] for k in targets) + " |",
                  "|---|" + "---:|" * len(targets)]
        lines += ["| " + " | ".join([_label(row), *(_cell(row, k) for k in targets)]) + " |" for row in rows]
    return "\n".join(lines)


def constant_baseline(config: Mapping[str, Any], statistic: str = "mean") -> dict[str, float]:
    """Test metrics of predicting a training statistic of every target (regression
    tasks: sentiment, traits): ``mean`` (the best constant for MSE) or ``median``
    (the best constant for MAE); {} for classification."""
    return constant_baselines(config, statistics=(statistic,)).get(CONSTANT_ROWS[statistic], {})


def constant_baselines(
    config: Mapping[str, Any], statistics: Sequence[str] = ("median", "mean")
) -> dict[str, dict[str, float]]:
    """Test metrics of constant predictions, row name (:data:`CONSTANT_ROWS`) -> metrics:
    the floor that MAE and multi-class accuracy of a weak-signal dataset must be read
    against. The training median of each target minimises the training MAE of a
    constant, the training mean its MSE, so a table of MAE shows the median's row: the
    mean's would flatter every model. Where the two are equal for every target, one
    row ``constant (train mean = median)``. {} for classification."""
    return task_spec(config["task"]["type"]).baselines(config, statistics)


def _header(key: str) -> str:
    if key.startswith("val_"):
        return "val " + _HEADERS.get(key[4:], key[4:])
    return _HEADERS.get(key, key)
