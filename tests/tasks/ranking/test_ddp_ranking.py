"""Retrieval and Chimera under DDP: 2 processes (gloo on CPU) with half of every global
batch each train, validate and test as 1 process on the whole batch.

What makes them equal (docs/ARCHITECTURE.md, "Which task types train with DDP"): the
distinct-video batches are drawn for the global batch and sharded; the contrastive terms
see the whole batch's negatives (embeddings gathered with their gradients); the other
terms average over the whole batch; evaluation ranks the whole split on every process.

Tolerance 1e-5 on the weights: the two runs do the same arithmetic except for the
sizes of the matrix products (a share of the batch against the whole one) and the order
of a few sums (DDP's all-reduce of the gradients), which move float32 results by a few
ulps per step; after 2 epochs of Adam the weights (of order 0.1 to 1) agree to ~1e-6.
The recalls and ranks are integers over the split (rank flips would need two scores
within ~1e-6 of each other) and must agree exactly up to float formatting.
Neither model has dropout: nothing draws from the global random generator.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tests.helpers.ports import free_port
from tests.tiny.chimera import chimera_config as _chimera
from tests.tiny.retrieval import retrieval_config as _retrieval

from polyfuse.engine import read_checkpoint, train

TOLERANCE = 1e-5


def _epoch_losses(run_dir: Path) -> list[dict[str, float]]:
    """The train/ columns of every epoch's row of the run's metrics.csv."""
    (path,) = run_dir.rglob("metrics.csv")
    with path.open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train/loss")]
    return [{k: float(v) for k, v in row.items() if k.startswith("train/") and v} for row in rows]


def _two_match_one(config: dict, tmp_path: Path) -> tuple[dict, dict]:
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "polyfuse.cli.main", "train", "--config", str(path),
               "--out", str(tmp_path / "two"), "--devices", "2", "--strategy", "ddp"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    single = train(config, run_dir=tmp_path / "one")
    two = read_checkpoint(tmp_path / "two/checkpoints/last.safetensors")
    one = read_checkpoint(tmp_path / "one/checkpoints/last.safetensors")
    assert two["global_step"] == one["global_step"] > 0  # the same optimiser steps
    assert two["state_dict"].keys() == one["state_dict"].keys()
    for key, value in one["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][key], value, rtol=TOLERANCE, atol=TOLERANCE, msg=key)
    # the training loss curve, epoch by epoch, every term
    curve_two, curve_one = _epoch_losses(tmp_path / "two"), _epoch_losses(tmp_path / "one")
    assert len(curve_two) == len(curve_one) == config["trainer"]["max_epochs"]
    for epoch_two, epoch_one in zip(curve_two, curve_one, strict=True):
        assert epoch_two.keys() == epoch_one.keys()
        assert epoch_two == pytest.approx(epoch_one, rel=TOLERANCE, abs=TOLERANCE)
    results = json.loads((tmp_path / "two/results.json").read_text())
    assert results["validation"].keys() == single.validation.keys()
    assert results["validation"] == pytest.approx(single.validation, abs=TOLERANCE)
    assert results["test"] == pytest.approx(single.test, abs=TOLERANCE)
    ones = json.loads((tmp_path / "one/results.json").read_text())
    assert results["test_shuffled_words"] == pytest.approx(ones["test_shuffled_words"], abs=TOLERANCE)
    assert results["best_epoch"] == ones["best_epoch"]
    # training moved the weights far beyond the tolerance (Adam: about lr = 1e-3 per step): the comparison has teeth
    first = _initial_state(config, tmp_path)
    moved = max((one["state_dict"][k] - first[k]).abs().max().item() for k in first)
    assert moved > 100 * TOLERANCE
    return results, json.loads((tmp_path / "one/results.json").read_text())


def _initial_state(config: dict, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The weights before training (a 0-epoch run's first checkpoint is not written: build the module)."""
    from polyfuse.engine import resolve_config, seed_everything
    from polyfuse.tasks.registry import task_spec

    resolved = resolve_config({**config, "output_dir": str(tmp_path / "initial")})
    seed_everything(int(resolved["seed"]))
    spec = task_spec(resolved["task"]["type"])
    return spec.build_module(resolved, spec.build_data(resolved)).state_dict()


def test_retrieval_two_processes_match_one(tmp_path):
    # 60 synthetic videos; global batches of 8 distinct videos, 4 per process
    config = _retrieval(tmp_path)
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    config["data"]["eval_batch_size"] = 5  # several chunks per process at evaluation
    _two_match_one(config, tmp_path)


def test_retrieval_infonce_two_processes_match_one(tmp_path):
    # a global batch of 7 videos: shares of 4 and 3 (padded to gather); the last batch of each epoch is smaller
    config = _retrieval(tmp_path)
    config["retrieval"]["loss"] = "infonce"
    config["data"]["batch_size"] = 7
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    _two_match_one(config, tmp_path)


def test_chimera_two_processes_match_one(tmp_path):
    # 8 training videos in global batches of 4 (2 per process), masking on (Table 4's protocol)
    config = _chimera(tmp_path)
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    config["data"]["eval_batch_size"] = 1  # chunks of one caption: each process scores its own
    _two_match_one(config, tmp_path)


def test_chimera_without_masking_uneven_shares_match_one(tmp_path):
    # the token-state path (no masking, so no L_T); global batches of 3: shares of 2 and 1
    config = _chimera(tmp_path)
    config["chimera"]["mask_rate"] = 0.0
    config["data"]["batch_size"] = 3
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    _two_match_one(config, tmp_path)
