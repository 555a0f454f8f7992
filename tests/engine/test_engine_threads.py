"""Thread defaults never oversubscribe the free cores; a run says and records what it used.

The expected numbers are worked out by hand from the rule in polyfuse.engine.threads:
per process max(1, cores // processes), one inter-op thread, loader workers, the rest
intra-op.
"""

import json
import os

import pytest
import torch
import yaml

from polyfuse.cli.main import main
from polyfuse.engine import train
from polyfuse.engine.threads import apply_thread_plan, free_cores, plan_threads, thread_plan_for


@pytest.mark.parametrize(
    ("cores", "processes", "workers", "intra"),
    [(2, 1, 0, 1), (1, 1, 0, 1), (4, 1, 0, 3), (16, 2, 0, 7), (8, 1, 2, 5), (12, 3, 1, 2), (3, 2, 0, 1)],
)
def test_default_plan_for_mocked_core_counts(monkeypatch, cores, processes, workers, intra):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert free_cores() == cores
    plan = plan_threads(None, processes=processes, loader_workers=workers)
    assert (plan.intra_op, plan.inter_op, plan.cores, plan.chosen_by) == (intra, 1, cores, "default")
    assert plan.busy == processes * (intra + 1 + workers)
    if cores >= 2 * processes + processes * workers:  # room for 1 + 1 per process and the workers
        assert plan.busy <= cores and not plan.oversubscribed


def test_affinity_not_cpu_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert plan_threads(None).to_dict() == {
        "intra_op": 1, "inter_op": 1, "processes": 1, "loader_workers": 0, "cores": 1,
        "chosen_by": "default", "busy": 2, "oversubscribed": True}


def test_explicit_threads_are_kept_and_warned_about():
    plan = plan_threads(2, cores=2)
    assert (plan.intra_op, plan.busy, plan.oversubscribed) == (2, 3, True)
    assert "WARNING: 3 busy threads on 2 cores" in plan.describe()
    quiet = plan_threads(1, cores=8)
    assert not quiet.oversubscribed and "WARNING" not in quiet.describe()
    assert thread_plan_for({"trainer": {"num_threads": None, "devices": 2}, "data": {}}).processes == 2
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        plan_threads(0, cores=2)


def test_apply_sets_the_intra_op_pool():
    before = torch.get_num_threads()
    try:
        used = apply_thread_plan(plan_threads(1, cores=4))
        assert used["intra_op"] == torch.get_num_threads() == 1
        assert used["inter_op"] == torch.get_num_interop_threads()
    finally:
        torch.set_num_threads(before)


def test_run_prints_and_records_its_threads(tiny_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    config_file = tmp_path / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(trainer={"max_epochs": 1, "num_threads": None})))
    run = tmp_path / "run"
    assert main(["train", "--config", str(config_file), "--out", str(run), "--no-progress", "--quiet"]) == 0
    recorded = json.loads((run / "results.json").read_text())["threads"]
    assert (recorded["intra_op"], recorded["inter_op"], recorded["cores"]) == (1, 1, 2)
    assert recorded["chosen_by"] == "default" and recorded["torch_intra_op"] == 1
    assert "threads: 1 intra-op + 1 inter-op per process, 1 process, 0 data loader workers, 2 free cores" in (
        capsys.readouterr().out)


def test_an_oversubscribing_run_warns(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with pytest.warns(UserWarning, match="2 busy threads on 1 cores oversubscribe"):
        train(tiny_config(trainer={"max_epochs": 1, "num_threads": 1}), run_dir=tmp_path / "run")


@pytest.mark.parametrize(
    ("cores", "processes", "workers", "intra"),
    # workers = min(4, max(0, cores // processes - 2) // 2), by hand; intra = the rest less 1 inter-op
    [(1, 1, 0, 1), (2, 1, 0, 1), (3, 1, 0, 2), (4, 1, 1, 2), (8, 1, 3, 4), (16, 1, 4, 11), (16, 2, 3, 4), (64, 1, 4, 59)],
)
def test_loader_workers_come_from_the_free_cores_unless_set(monkeypatch, cores, processes, workers, intra):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    config = {"trainer": {"num_threads": None, "devices": processes}, "data": {"loader_workers": None}}
    plan = thread_plan_for(config)
    assert (plan.loader_workers, plan.intra_op) == (workers, intra)
    if cores >= 2 * processes:
        assert not plan.oversubscribed
    config["data"]["loader_workers"] = 2
    assert thread_plan_for(config).loader_workers == 2
