"""``polyfuse bench ddp`` on one tiny task type: the JSON's header, the runs it records
(1 and 2 processes, the same steps per epoch, every epoch timed) and the numbers derived
from them (seconds per epoch: the median after the warm-up; ratio: 2 processes over 1)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from polyfuse.bench.ddp import FULL, TASKS, run_ddp_bench
from polyfuse.cli.main import main
from polyfuse.tasks.registry import available_tasks


def test_one_task_type_with_one_and_two_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert main(["bench", "ddp", "--quick", "--epochs", "3", "--output-dir", str(out), "--quiet"]) == 0
    payload = json.loads((out / "ddp.json").read_text())
    assert payload["benchmark"] == "ddp" and payload["machine"]["logical_cpus"] >= 1
    assert payload["settings"]["tasks"] == ["sentiment"] and payload["settings"]["epochs"] == 3
    load = payload["load"]
    assert load["seconds"] > 0 and {"machine_busy", "own", "others", "loadavg_1min"} <= load.keys()
    if load["machine_busy"] is not None:  # Linux: the training processes' CPU time is counted as theirs
        assert 0 < load["children"] <= 1 and load["others"] >= 0
    (row,) = payload["rows"]
    one, two = row["one_process"], row["two_processes"]
    assert row["task"] == "sentiment" and (one["world_size"], two["world_size"]) == (1, 2)
    assert one["steps_per_epoch"] == two["steps_per_epoch"] > 0  # the same global batches
    warmup = payload["settings"]["warmup_epochs"]
    for run in (one, two):
        (epochs,) = run["epoch_seconds"]  # one repeat
        assert len(epochs) == 3 and all(seconds > 0 for seconds in epochs)
        assert run["seconds_per_epoch"] == statistics.median(epochs[warmup:])
        assert run["wall_seconds"][0] > sum(epochs)  # the process also starts, tests and writes
    assert row["ratio"] == pytest.approx(two["seconds_per_epoch"] / one["seconds_per_epoch"], rel=1e-12)
    report = (out / "ddp.md").read_text()
    assert f"| sentiment | {one['steps_per_epoch']} / {two['steps_per_epoch']} | {one['seconds_per_epoch']:.2f} |" in report
    assert f"| {row['ratio']:.2f} |" in report and "\npolyfuse bench ddp" in report
    assert capsys.readouterr().out.count("## Data parallel") == 1


def test_every_task_type_has_data_and_wrong_settings_are_refused() -> None:
    assert set(TASKS) == set(available_tasks()) and FULL.tasks == TASKS
    with pytest.raises(ValueError, match=r"unknown task type.*nope"):
        run_ddp_bench(FULL.__class__(tasks=("nope",)))
    with pytest.raises(ValueError, match="epochs must exceed warmup_epochs"):
        run_ddp_bench(FULL.__class__(epochs=1))
