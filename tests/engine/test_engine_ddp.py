"""Data-parallel training: 2 processes (DDP, gloo on CPU) with half the batch each
train the same model as 1 process on the same global batch, up to float tolerance."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from polyfuse.engine import read_checkpoint, resolve_config, seed_everything, train
from polyfuse.tasks.registry import task_spec


def build_task(config, input_dims, names, label_info):
    """The task module of config's task type around a new backbone."""
    return task_spec(config["task"]["type"]).module_for(config, input_dims, names, label_info)


def test_two_processes_match_one(tiny_config, tmp_path, free_port):
    # 200 samples: 40 test, 32 validation, 128 training = 8 global batches of 16.
    config = tiny_config(
        model={"dropout": 0.0, "encoder": {"dropout": 0.0}},
        trainer={"max_epochs": 2, "num_threads": 1},
    )
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port), OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "polyfuse.cli.main", "train", "--config", str(path),
        "--out", str(tmp_path / "two"), "--devices", "2", "--strategy", "ddp",
    ]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240)
    assert finished.returncode == 0, finished.stderr[-3000:]
    single = train(config, run_dir=tmp_path / "one")
    two = read_checkpoint(tmp_path / "two/checkpoints/last.safetensors")
    one = read_checkpoint(tmp_path / "one/checkpoints/last.safetensors")
    assert two["global_step"] == one["global_step"] == 16  # same number of optimiser steps
    for key, value in one["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][key], value, rtol=1e-5, atol=1e-5, msg=key)
    results = json.loads((tmp_path / "two/results.json").read_text())
    assert results["validation"] == pytest.approx(single.validation, abs=1e-5)
    assert results["test"] == pytest.approx(single.test, abs=1e-5)
    # Training moved the weights well beyond the tolerance: the comparison has teeth.
    seed_everything(config.get("seed", 0))
    resolved = resolve_config(config)
    data = task_spec(resolved["task"]["type"]).build_data(resolved).prepared
    initial = build_task(resolved, data.input_dims, data.modalities, data.label_info).state_dict()
    moved = max((one["state_dict"][k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-2
