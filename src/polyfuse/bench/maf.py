"""``polyfuse bench maf``: how concentrated MAF's Eq. 19 attention is in trained captioning runs.

HOCA's Eq. 19 read literally, ``softmax(sum_k theta_k alpha_k)``, takes a softmax of a
weighted sum of probabilities; polyfuse's default, ``softmax(sum_k theta_k log alpha_k)``,
one of weighted logits (``decoder.combination: literal | log``, see
:mod:`polyfuse.nn.maf`). Training and scoring the two forms is the engine's job:
``polyfuse compare`` with ``configs/msvd/variants/maf_literal.yaml`` and
``maf_log.yaml`` (or ``polyfuse train`` once per form). What those runs do not record
is the attention itself, and this bench adds that measure.

For every run directory it loads the best checkpoint through the engine's public API
(:func:`polyfuse.engine.apply_checkpoint`), decodes the videos of a split greedily (the
checkpoint's ``captioning.max_length`` and its rule on ``<unk>``) and, for each
modality, averages the entropy ``-sum_t a_t log a_t`` (nats) of the Eq. 19 attention
over every generated word of every video, the end token included. ``relative`` divides
each word's entropy by ``log T`` of its video's real steps (1: uniform attention). The
caption metrics and the teacher-forced test loss are those the run wrote in its
``results.json`` (beam search, as at test time); the bench does not recompute them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from polyfuse.bench.results import result_header
from polyfuse.data.formats.jsonfile import read_json

__all__ = ["METRICS", "attention_entropy", "checkpoint_entropy", "find_runs", "maf_table", "run_maf_bench",
           "summarise_forms"]

#: the caption metrics copied from each run's results.json, in table order
METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "loss")


def attention_entropy(attention: Tensor) -> Tensor:
    """Entropy -sum_t a_t log a_t (nats) of each row of (..., T) attention (0 log 0 = 0)."""
    logs = torch.where(attention > 0, attention.log(), torch.zeros_like(attention))
    return -(attention * logs).sum(dim=-1)


def find_runs(paths: Sequence[str | Path]) -> list[tuple[str, Path]]:
    """``(label, run directory)`` of each path: a run directory (it has ``results.json``;
    labelled by its name) or a ``polyfuse compare`` output (every ``<model>/seed<N>``
    run below it, labelled ``<model>/seed<N>``)."""
    runs: list[tuple[str, Path]] = []
    for given in paths:
        path = Path(given)
        if (path / "results.json").is_file():
            runs.append((path.resolve().name, path))
            continue
        found = sorted(p.parent for p in path.glob("*/seed*/results.json"))
        if not found:
            raise FileNotFoundError(
                f"bench maf: {path} is neither a run directory (no results.json) nor a "
                "polyfuse compare output (no <model>/seed<N>/results.json)"
            )
        runs.extend((f"{run.parent.name}/{run.name}", run) for run in found)
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"bench maf: two runs have the same label: {labels}")
    return runs


def checkpoint_entropy(checkpoint: str | Path, *, split: str = "test") -> dict[str, Any]:
    """Mean Eq. 19 attention entropy per modality of a captioning checkpoint over the
    greedy captions of ``split`` (see the module docstring), with the checkpoint's
    ``decoder`` settings."""
    from polyfuse.engine import apply_checkpoint

    applied = apply_checkpoint(checkpoint, split=split)
    config = applied.extras["config"]
    task = applied.module
    if not callable(getattr(getattr(getattr(task, "model", None), "decoder", None), "greedy", None)):
        raise ValueError(f"bench maf: {checkpoint} (task.type {config['task']['type']}) has no caption decoder; "
                         "it reads task.type captioning runs")
    vocabulary = task.vocabulary
    modalities = list(applied.extras["modalities"])
    nats = [0.0] * len(modalities)
    relative = [0.0] * len(modalities)
    relative_words = [0] * len(modalities)
    uniform = [0.0] * len(modalities)
    words = videos = 0
    (loader,) = applied.loaders().values()
    with torch.no_grad():
        for batch in loader:
            masks = batch["masks"]
            videos += len(batch["videos"])
            tokens, steps = task.model.decoder.greedy(
                task.model.encode(batch["inputs"], masks), masks, begin_index=vocabulary.begin,
                end_index=vocabulary.end, max_length=task.max_length, banned_tokens=task.banned_tokens,
            )
            generated = tokens != vocabulary.pad  # (B, S): the words, up to and with the end token
            words += int(generated.sum())
            for m, mask in enumerate(masks):
                entropy = attention_entropy(torch.stack([step.attention[m] for step in steps], dim=1))  # (B, S)
                log_length = mask.sum(dim=1).double().log()[:, None].expand_as(entropy)  # (B, S)
                nats[m] += float(entropy[generated].double().sum())
                uniform[m] += float(log_length[generated].sum())
                spread = generated & (log_length > 0)  # a single step has no entropy to compare
                relative[m] += float((entropy.double()[spread] / log_length[spread]).sum())
                relative_words[m] += int(spread.sum())
    if words == 0:
        raise ValueError(f"bench maf: no video in the {split!r} split of {checkpoint}")
    return {
        "split": split,
        "seed": config["seed"],
        "videos": videos,
        "words": words,
        "combination": config["decoder"]["combination"],
        "variant": config["decoder"]["variant"],
        "modalities": {
            name: {
                "nats": nats[m] / words,
                "relative": relative[m] / relative_words[m] if relative_words[m] else None,
                "uniform_nats": uniform[m] / words,
            }
            for m, name in enumerate(modalities)
        },
    }


def _run_row(label: str, run_dir: Path, split: str) -> dict[str, Any]:
    results = read_json(run_dir / "results.json")
    if not isinstance(results, dict) or not isinstance(results.get("best_checkpoint"), str):
        raise ValueError(f"bench maf: {run_dir / 'results.json'} names no best_checkpoint")
    checkpoint = run_dir / results["best_checkpoint"]
    measured = checkpoint_entropy(checkpoint, split=split)
    test = results.get("test") or {}
    return {
        "label": label,
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "best_epoch": results.get("best_epoch"),
        "epochs": results.get("epochs"),
        **measured,
        "test": {key: test.get(key) for key in METRICS},
    }


def _numbers(row: dict[str, Any], modalities: Sequence[str]) -> dict[str, float | None]:
    """The numbers of one run, by column: entropy and relative entropy per modality, the metrics."""
    numbers: dict[str, float | None] = {}
    for name in modalities:
        entry = row["modalities"].get(name) or {}
        numbers[f"nats {name}"] = entry.get("nats")
        numbers[f"relative {name}"] = entry.get("relative")
    return numbers | {key: row["test"][key] for key in METRICS}


def summarise_forms(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per Eq. 19 form run with two seeds or more: the number of runs and the mean and
    sample standard deviation of each number of the table."""
    modalities = list(dict.fromkeys(name for row in rows for name in row["modalities"]))
    summary: dict[str, dict[str, Any]] = {}
    for form in dict.fromkeys(row["combination"] for row in rows):
        group = [_numbers(row, modalities) for row in rows if row["combination"] == form]
        if len(group) < 2:
            continue
        summary[form] = {"runs": len(group)}
        for column in group[0]:
            values = [numbers[column] for numbers in group if numbers[column] is not None]
            summary[form][column] = {"mean": statistics.mean(values) if values else None,
                                     "std": statistics.stdev(values) if len(values) > 1 else None}
    return summary


def _cell(column: str, value: float | None, std: float | None = None) -> str:
    if value is None:
        return "n/a"
    scale, digits = (1.0, 3) if column == "loss" or column.startswith(("nats ", "relative ")) else (100.0, 1)
    text = f"{scale * value:.{digits}f}"
    return text if std is None else f"{text} ± {scale * std:.{digits}f}"


def maf_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: one line per run (entropy per modality in nats, relative entropy
    in brackets, the test metrics x 100 and the test loss), then, for a form run with
    several seeds, its mean ± sample std."""
    modalities = list(dict.fromkeys(name for row in rows for name in row["modalities"]))
    header = ["run", "Eq. 19 form", "seed", *(f"entropy {name}, nats (relative)" for name in modalities),
              *("test loss" if key == "loss" else key for key in METRICS)]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]

    def cells(first: list[str], numbers: dict[str, Any], spread: bool) -> str:
        def pick(column: str) -> tuple[float | None, float | None]:
            value = numbers[column]
            return (value["mean"], value["std"]) if spread else (value, None)

        out = list(first)
        for name in modalities:
            nats, relative = pick(f"nats {name}"), pick(f"relative {name}")
            out.append(f"{_cell(f'nats {name}', *nats)} ({_cell(f'relative {name}', relative[0])})")
        out.extend(_cell(key, *pick(key)) for key in METRICS)
        return "| " + " | ".join(out) + " |"

    forms = list(dict.fromkeys(row["combination"] for row in rows))
    for row in sorted(rows, key=lambda row: forms.index(row["combination"])):  # stable: runs in given order
        lines.append(cells([row["label"], row["combination"], str(row["seed"])], _numbers(row, modalities), False))
    for form, numbers in summarise_forms(rows).items():
        lines.append(cells([f"mean ± std ({numbers['runs']} runs)", form, ""], numbers, True))
    return "\n".join(lines) + "\n"


def run_maf_bench(
    paths: Sequence[str | Path], *, split: str = "test", progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The entropy of every run of ``paths`` (:func:`find_runs`) and its test metrics; a JSON-ready dict."""
    rows = []
    for label, run_dir in find_runs(paths):
        rows.append(_run_row(label, run_dir, split))
        if progress is not None:
            entropy = ", ".join(f"{name} {entry['nats']:.3f}" for name, entry in rows[-1]["modalities"].items())
            progress(f"{label} ({rows[-1]['combination']}): entropy {entropy} nats over {rows[-1]['words']} words")
    payload = result_header("maf", {"runs": [str(p) for p in paths], "split": split})
    payload["rows"] = rows
    payload["summary"] = summarise_forms(rows)
    payload["table"] = maf_table(rows)
    if any(math.isnan(entry["nats"]) for row in rows for entry in row["modalities"].values()):
        raise ValueError("bench maf: an attention entropy is NaN (attention with NaN weights)")
    return payload
