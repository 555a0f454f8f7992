"""``polyfuse bench data`` on one tiny task, measured in this process: what a loader pass
counts (every training row once, the batches, a cap), the training step's items, the ratio
derived from the recorded numbers and the markdown table made from them. No timing is
asserted."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from polyfuse.bench.data import (
    BASE_SIZES,
    QUICK,
    TASKS,
    _optimizers,
    _with_workers,
    data_markdown,
    measure_loader,
    measure_step,
    task_row,
    write_task,
)
from polyfuse.bench.ddp import TASKS as DDP_TASKS
from polyfuse.bench.results import result_header, write_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The tiny sentiment set at N and 4N (the smallest tabular sets: 40 and 128 rows)."""
    root = tmp_path_factory.mktemp("bench-data")
    return {f"{factor}N": write_task("sentiment", root / f"{factor}N", size=0.01 * factor) for factor in (1, 4)}


def test_every_task_has_a_size() -> None:
    assert (*DDP_TASKS, "vqa-bottom-up") == TASKS and set(BASE_SIZES) == set(TASKS)


@pytest.fixture(scope="module")
def measured(sentiment: dict[str, dict]) -> tuple[dict[str, dict], dict]:
    """Each loader pass of the benchmark (N and 4N, 0 and 2 workers) and the training step."""
    runs = {f"{size}-w{workers}": measure_loader(_with_workers(sentiment[size], workers))
            for size in ("1N", "4N") for workers in QUICK.workers}
    step = measure_step(sentiment["1N"], warmup_steps=1, min_steps=2, max_steps=2, step_seconds=0.0, threads=1)
    return runs, step


def test_a_loader_pass_reads_every_training_row_once(measured: tuple[dict[str, dict], dict]) -> None:
    runs, _ = measured
    for key, train in (("1N-w0", 28), ("1N-w2", 28), ("4N-w0", 89), ("4N-w2", 89)):  # 70% of 40 and 128 rows
        run = runs[key]
        assert run["workers"] == int(key[-1]) and run["items"] == run["samples"]["train"] == train
        assert run["batches"] == run["batches_per_epoch"] == math.ceil(train / 32) and not run["capped"]
        assert run["peak_rss"] >= run["peak_rss_built"] > 0 and run["first_batch_seconds"] > 0
    assert runs["1N-w0"]["workers_memory"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers' memory is read from /proc")
def test_the_two_workers_are_seen(measured: tuple[dict[str, dict], dict]) -> None:
    for key in ("1N-w2", "4N-w2"):
        workers = measured[0][key]["workers_memory"]
        assert len(workers) == 2 and all(0 < worker["private"] <= worker["peak_rss"] for worker in workers)


def test_the_pass_stops_at_the_cap_and_counts_what_it_read(sentiment: dict[str, dict]) -> None:
    run = measure_loader(_with_workers(sentiment["4N"], 0), max_batches=2)
    assert run["samples"]["train"] == 89 and run["batches_per_epoch"] == 3
    assert run["batches"] == 2 and run["items"] == 64 and run["capped"]
    assert run["items_per_second"] > 0  # the second batch over the time after the first


def test_the_training_step_counts_the_items_it_timed(measured: tuple[dict[str, dict], dict]) -> None:
    step = measured[1]
    assert step["threads"] == 1 and step["steps"] == len(step["step_seconds"]) == 2
    # the 28 rows are one batch: every step reuses it
    assert step["items"] == 2 * 28 and step["model"] == "man" and step["parameters"] > 0
    assert step["items_per_second"] == pytest.approx(step["items"] / sum(step["step_seconds"]), rel=1e-12)


def test_the_step_restores_the_threads(sentiment: dict[str, dict]) -> None:
    threads = torch.get_num_threads()
    measure_step(sentiment["1N"], warmup_steps=0, min_steps=1, max_steps=1, step_seconds=0.0, threads=threads + 1)
    assert torch.get_num_threads() == threads


def test_the_optimisers_of_every_form_lightning_accepts() -> None:
    a, b = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1) for _ in range(2))
    schedule = torch.optim.lr_scheduler.StepLR(a, 1)
    assert _optimizers(a) == [a] and _optimizers([a, b]) == [a, b] and _optimizers(None) == []
    assert _optimizers({"optimizer": a, "lr_scheduler": {"scheduler": schedule}}) == [a]
    assert _optimizers(([a, b], [schedule])) == [a, b]
    assert _optimizers([{"optimizer": a}, {"optimizer": b}]) == [a, b]
    with pytest.raises(TypeError):
        _optimizers("sgd")


def test_the_ratio_and_the_table_come_from_the_recorded_numbers(measured: tuple[dict[str, dict], dict],
                                                                tmp_path: Path) -> None:
    settings = QUICK
    runs, step = measured
    row = task_row("sentiment", runs, step, settings, {"1N": 0.1, "4N": 0.2})
    assert row["ratio_of"] == "4N-w2"
    assert row["ratio"] == pytest.approx(runs["4N-w2"]["items_per_second"] / step["items_per_second"], rel=1e-12)
    assert row["rss_growth"]["w0"]["bytes"] == runs["4N-w0"]["peak_rss"] - runs["1N-w0"]["peak_rss"]
    failed = task_row("traits", {"1N-w0": {"error": "boom"}}, {"error": "no data written"}, settings, {})
    assert failed["ratio"] is None and failed["rss_growth"] == {}

    payload = result_header("data", dataclasses.asdict(settings))
    payload |= {"rows": [row, failed], "load": {}}
    text = data_markdown(payload, "polyfuse bench data --quick")
    mib = 1024 * 1024

    def rss(run: dict) -> str:
        return f"{run['peak_rss'] / mib:.0f} + {sum(w['private'] for w in run['workers_memory']) / mib:.0f}"

    expected = (f"| sentiment | 28 / 89 | {runs['1N-w0']['peak_rss'] / mib:.0f} / {runs['4N-w0']['peak_rss'] / mib:.0f} "
                f"| {rss(runs['1N-w2'])} / {rss(runs['4N-w2'])} "
                f"| {runs['4N-w0']['items_per_second']:.0f} / {runs['4N-w2']['items_per_second']:.0f} "
                f"| {step['items_per_second']:.1f} | {row['ratio']:.1f} |")
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[1] == expected  # after the header
    assert table[2].startswith("| traits | ? / ? | failed / n/a |") and table[2].endswith("| failed | n/a |")
    assert "- traits 1N-w0: boom" in text and "- traits step: no data written" in text
    assert "- sentiment: RSS growth from N to 4N: 0 workers " in text
    assert "polyfuse bench data --quick" in text

    # docs/BENCHMARKS.md gets the same table from data.json
    write_results(tmp_path / "results" / "data.json", payload)
    spec = importlib.util.spec_from_file_location("write_benchmarks_md", ROOT / "scripts" / "write_benchmarks_md.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--results", str(tmp_path / "results"), "--output", str(tmp_path / "BENCHMARKS.md")]) == 0
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert expected in markdown and "polyfuse bench data --output-dir docs/benchmarks" in markdown


def test_an_unknown_task_is_refused(tmp_path: Path) -> None:
    from polyfuse.bench.data import DataBenchSettings, run_data_bench

    with pytest.raises(ValueError, match="unknown task"):
        run_data_bench(DataBenchSettings(tasks=("sentiment", "nope")))
    with pytest.raises(ValueError, match="unknown task type"):
        write_task("nope", tmp_path / "x", size=1)
