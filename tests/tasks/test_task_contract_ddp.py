"""The task contract under data parallel: every registered task type (its tiny
configuration of :data:`tests.tiny.tasks.TINY`, every dropout 0: each
process would draw its own masks) trained by 2 processes (DDP, gloo on CPU, through the
CLI as a user starts it) and by 1 process with the same global batch and seed takes the
same number of optimiser steps and ends with

- the same loss curves (every per-epoch train/ and val/ value of the CSV logs) and the
  same validation and test metrics of ``results.json``, to :data:`METRIC_TOLERANCE`
  (the processes' sums are added in another order: float32 rounding, nothing more);
- the same last-checkpoint weights, to :data:`WEIGHT_TOLERANCE` (Adam divides by the
  square root of the second moment, which turns the rounding of differently summed
  gradients into somewhat larger weight differences; training moves the weights well
  beyond the tolerance, checked).

And a 2-process run interrupted (Ctrl-C) after its first epoch and resumed with
``polyfuse train --resume`` ends bit-equal to the uninterrupted 2-process run: weights,
test metrics and loss curves.

A new task type is run here as soon as it is in TINY.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from tests.helpers.ports import free_port
from tests.tiny.tasks import TINY

from polyfuse.cli.main import EXIT_INTERRUPTED
from polyfuse.engine.checkpoints import checkpoint_epoch, read_checkpoint
from polyfuse.engine.run import train

# Measured here (2026-11-29, every task type): metrics differ by at most 5e-7 (traits'
# mae/t1 of 4.28; 2e-7 relative, sentiment's corr), weights by at most 2.3e-6 (captioning;
# 6e-7 VQA, 2e-7 Chimera, <= 3e-8 the others), and training moved the weights by 4e-3
# (Chimera) to 0.12 (VQA).
#: rel, abs of the validation and test metrics
METRIC_TOLERANCE = {"rel": 1e-5, "abs": 1e-6}
#: rtol, atol of the last checkpoint's weights
WEIGHT_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
#: the largest change of a weight in the 1-process run is at least this (100 x the
#: weights' atol): the weight comparison has teeth
MOVED_AT_LEAST = 1e-3



def _without_dropout(node: Any) -> Any:
    """``node`` with every ``*dropout`` value set to 0."""
    if isinstance(node, dict):
        return {k: 0.0 if "dropout" in k and isinstance(v, float) else _without_dropout(v) for k, v in node.items()}
    return node


def _tiny_without_dropout(name: str, folder: Path) -> dict:
    config = TINY[name](folder)
    config["trainer"] = {**config["trainer"], "max_epochs": 2, "num_threads": 1}
    if "model" in config and name in ("sentiment", "traits", "classification"):
        config["model"]["encoder"] = {**config["model"].get("encoder", {}), "dropout": 0.0}  # default 0.1
    if name == "chimera":  # the tiny BERT's own dropouts (transformers' defaults 0.1)
        bert = Path(config["chimera"]["encoder_path"]) / "config.json"
        settings = json.loads(bert.read_text())
        settings.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        bert.write_text(json.dumps(settings))
    return _without_dropout(config)


class _InitialWeights(Callback):
    """Keeps the module's weights as training starts."""

    def on_train_start(self, trainer, module):
        self.state = {k: v.detach().clone() for k, v in module.state_dict().items()}


# The CLI as a user starts it; with POLYFUSE_TEST_INTERRUPT, Ctrl-C at the start of the
# second epoch (in every process: Lightning starts the second one with this same command).
DRIVER = """
import os, sys
from polyfuse.cli.main import main
from polyfuse.engine.seeding import ReseedEachEpoch

reseed = ReseedEachEpoch.on_train_epoch_start

def interrupt(self, trainer, module):
    if os.environ.get("POLYFUSE_TEST_INTERRUPT") and trainer.current_epoch == 1:
        raise KeyboardInterrupt
    reseed(self, trainer, module)

ReseedEachEpoch.on_train_epoch_start = interrupt
sys.exit(main(sys.argv[1:]))
"""


def _two_processes(folder: Path, *arguments: str, interrupt: bool = False) -> subprocess.CompletedProcess:
    driver = folder / "driver.py"
    driver.write_text(DRIVER)
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    if interrupt:
        environment["POLYFUSE_TEST_INTERRUPT"] = "1"
    return subprocess.run([sys.executable, str(driver), "train", *arguments, "--quiet"], env=environment,
                          cwd=folder, capture_output=True, text=True, timeout=240)


def _curves(run: Path) -> dict[tuple[str, str], float]:
    """(epoch, key) -> value of every per-epoch train/ and val/ value, over every CSV part of a run."""
    values = {}
    for path in sorted(run.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            values.update({(row["epoch"], k): float(v) for k, v in row.items() if k.startswith(("train/", "val/")) and v})
    return values


@pytest.fixture(scope="module", params=sorted(TINY))
def two_process_run(request, tmp_path_factory) -> tuple[str, Path]:
    """A task type's tiny configuration (``config.yaml``) and its 2-process run ``two``."""
    folder = tmp_path_factory.mktemp(f"ddp_{request.param}")
    config = _tiny_without_dropout(request.param, folder)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    finished = _two_processes(folder, "--config", str(folder / "config.yaml"), "--out", str(folder / "two"),
                              "--devices", "2", "--strategy", "ddp")
    assert finished.returncode == 0, finished.stderr[-3000:]
    return request.param, folder


def test_two_processes_train_as_one(two_process_run, tmp_path: Path) -> None:
    _, folder = two_process_run
    initial = _InitialWeights()
    train(yaml.safe_load((folder / "config.yaml").read_text()), run_dir=tmp_path / "one", callbacks=[initial])
    runs = {"two": folder / "two", "one": tmp_path / "one"}
    two, one = (read_checkpoint(runs[run] / "checkpoints/last.safetensors") for run in ("two", "one"))
    assert two["global_step"] == one["global_step"] > 0
    assert two["state_dict"].keys() == one["state_dict"].keys()
    for key, value in one["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][key], value, **WEIGHT_TOLERANCE, msg=key)
    # the same loss curves, epoch by epoch, every logged train/ and val/ value
    curves = {run: _curves(path) for run, path in runs.items()}
    assert curves["two"].keys() == curves["one"].keys() and any(k.startswith("train/") for _, k in curves["one"])
    for key, value in curves["one"].items():
        assert curves["two"][key] == pytest.approx(value, **METRIC_TOLERANCE), key
    results = {run: json.loads((path / "results.json").read_text()) for run, path in runs.items()}
    for split in ("validation", "test"):
        got, expected = results["two"][split], results["one"][split]
        assert got.keys() == expected.keys() and expected, split
        for key, value in expected.items():
            assert (math.isnan(value) and math.isnan(got[key])) or got[key] == pytest.approx(value, **METRIC_TOLERANCE), (split, key)
    assert results["two"]["epochs"] == results["one"]["epochs"] and results["two"]["best_epoch"] == results["one"]["best_epoch"]
    # Training moved the weights well beyond the tolerance: the comparison has teeth.
    moved = max((one["state_dict"][k].float() - initial.state[k].float()).abs().max().item()
                for k in initial.state if one["state_dict"][k].is_floating_point())
    assert moved > MOVED_AT_LEAST


def test_a_resumed_two_process_run_ends_as_the_uninterrupted_one(two_process_run) -> None:
    _, folder = two_process_run
    cut = folder / "cut"
    interrupted = _two_processes(folder, "--config", str(folder / "config.yaml"), "--out", str(cut), "--devices", "2",
                                 "--strategy", "ddp", interrupt=True)
    assert interrupted.returncode == EXIT_INTERRUPTED, interrupted.stderr[-3000:]
    assert checkpoint_epoch(cut / "checkpoints/last.safetensors") == 1  # the first epoch only
    resumed = _two_processes(folder, "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole, ended = (read_checkpoint(run / "checkpoints/last.safetensors") for run in (folder / "two", cut))
    assert ended["global_step"] == whole["global_step"]
    for key, value in whole["state_dict"].items():  # bit-equal, as one process is
        assert torch.equal(ended["state_dict"][key], value), key
    results = {run: json.loads((run / "results.json").read_text()) for run in (folder / "two", cut)}
    assert results[cut]["resumed"] and results[cut]["test"] == results[folder / "two"]["test"]
    assert _curves(cut) == _curves(folder / "two")
