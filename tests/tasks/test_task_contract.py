"""The contract every registered task type keeps (as tests/nn/test_contract.py does for the
fusion modules): on tiny data, through the engine's one path,

- a training run writes config.yaml, results.json and safetensors checkpoints only;
- ``evaluate`` on the best checkpoint gives the run's test numbers, ``predict`` its records;
- the checkpoint round-trips: the loaded module holds the file's weights;
- an interrupted run resumed from its last checkpoint ends as the uninterrupted one;
- an unknown key of the task's configuration is refused, naming it;
- a run whose loss becomes NaN exits with the divergence code.

A new task type fails here until :data:`TINY` gives it a tiny configuration and it passes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from safetensors import safe_open
from tests.cli.test_cli_vqa import _config as vqa_config
from tests.cli.test_cli_vqa import write_vqa_folder
from tests.tasks.captioning.test_captioning_engine import _config as captioning_config_file
from tests.tasks.captioning.test_captioning_engine import _write_data as write_captioning_data
from tests.tasks.chimera.test_chimera_task import write_corpus_files, write_tiny_bert

from polyfuse.cli.main import EXIT_DIVERGED, EXIT_INPUT, main
from polyfuse.engine.checkpoints import read_checkpoint
from polyfuse.engine.run import evaluate, load_model, predict, train
from polyfuse.tasks.registry import available_tasks, task_spec

TRAINER = {"max_epochs": 3, "patience": 0, "accelerator": "cpu", "progress_bar": False, "quiet": True, "num_threads": 1}


def _tabular(kind: str) -> Callable[[Path], dict]:
    def config(folder: Path) -> dict:
        rng = np.random.default_rng(0)
        a, b = rng.normal(size=(60, 4, 3)), rng.normal(size=(60, 5, 2))
        signal = a[:, :, 0].mean(1) * b[:, :, 1].mean(1)
        label = {"sentiment": np.clip(3 * signal, -3, 3), "traits": np.stack([signal, -signal], 1).clip(-1, 1) * 3 + 4,
                 "classification": np.digitize(signal, [-0.1, 0.1])}[kind]
        split = np.array(["train"] * 36 + ["valid"] * 12 + ["test"] * 12)
        np.savez(folder / "tiny.npz", a=a.astype(np.float32), b=b.astype(np.float32), label=label, split=split)
        task = {"type": kind, **({"target_ranges": [[1, 7], [1, 7]]} if kind == "traits" else {})}
        return {
            "output_dir": str(folder / "runs"),
            "task": task,
            "data": {"source": str(folder / "tiny.npz"), "modalities": ["a", "b"], "split": "split", "batch_size": 12},
            "model": {"fusion": "concat", "fusion_dim": 8, "out_dim": 8, "dropout": 0.2, "encoder": {"hidden_dim": 8}},
            "trainer": dict(TRAINER),
        }

    return config


def _vqa(folder: Path) -> dict:
    write_vqa_folder(folder)
    config = vqa_config(folder, dropout=0.2)
    config["trainer"] = {**config["trainer"], **TRAINER}
    return config


def _captioning(folder: Path) -> dict:
    write_captioning_data(folder)
    config = yaml.safe_load(captioning_config_file(folder).read_text())
    for section in ("features",):
        config["captioning"][section] = {k: str(folder / v) for k, v in config["captioning"][section].items()}
    for key in ("captions", "splits"):
        config["captioning"][key] = str(folder / config["captioning"][key])
    config["decoder"]["dropout"] = 0.2
    return {**config, "output_dir": str(folder / "runs"), "trainer": {**config["trainer"], **TRAINER}}


def _retrieval(folder: Path) -> dict:
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "retrieval"},
        "retrieval": {"source": "synthetic:videos=60,steps=2,events=2,dim=4", "text": "bow", "fusion": "man",
                      "embed_dim": 8, "hidden_dim": 8},
        "data": {"batch_size": 8, "eval_batch_size": 16},
        "trainer": dict(TRAINER),
    }


def _chimera(folder: Path) -> dict:
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "chimera"},
        "chimera": {**write_corpus_files(folder), "encoder_path": str(write_tiny_bert(folder / "bert")),
                    "num_topics": 3, "hyperbolic_dim": 3},
        "data": {"batch_size": 4, "eval_batch_size": 8},
        "trainer": dict(TRAINER),
    }


#: task type -> a tiny configuration (written under the given folder)
TINY: dict[str, Callable[[Path], dict]] = {
    "sentiment": _tabular("sentiment"),
    "traits": _tabular("traits"),
    "classification": _tabular("classification"),
    "vqa": _vqa,
    "captioning": _captioning,
    "retrieval": _retrieval,
    "chimera": _chimera,
}

#: an unknown key in the task's own part of the configuration, and the known key it is close to
TYPO: dict[str, tuple[str, str]] = {
    "sentiment": ("data", "sourc"),
    "traits": ("data", "sourc"),
    "classification": ("data", "sourc"),
    "vqa": ("data.vqa", "train_feature"),
    "captioning": ("captioning", "caption"),
    "retrieval": ("retrieval", "embed_dims"),
    "chimera": ("chimera", "num_topic"),
}


class _Interrupt(Callback):
    """Fails at the start of the second epoch, as a killed run would."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            raise RuntimeError("interrupted")


def test_every_registered_task_type_has_a_tiny_configuration():
    assert set(available_tasks()) == set(TINY), "give a new task type a tiny configuration in TINY (and TYPO)"
    assert set(TINY) == set(TYPO)


@pytest.fixture(params=sorted(TINY))
def tiny(request, tmp_path):
    return request.param, TINY[request.param](tmp_path), tmp_path


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6) for k in a
    )


def test_train_evaluate_predict_and_round_trip(tiny):
    name, config, folder = tiny
    result = train(config, run_dir=folder / "run")
    run = result.run_dir
    assert (run / "config.yaml").is_file() and yaml.safe_load((run / "config.yaml").read_text())["task"]["type"] == name
    results = json.loads((run / "results.json").read_text())
    assert results["test"] == result.test and result.test
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["best.safetensors", "last.safetensors"]
    for path in (run / "checkpoints").iterdir():
        with safe_open(str(path), framework="pt") as handle:  # safetensors, nothing pickled
            assert handle.keys()
    # evaluate gives the run's test numbers
    assert _close(evaluate(result.best_checkpoint, split="test"), result.test)
    # the loaded module holds the file's weights
    module, _ = load_model(result.best_checkpoint)
    stored = read_checkpoint(result.best_checkpoint)["state_dict"]
    state = module.state_dict()
    assert state.keys() == stored.keys()
    assert all(torch.equal(state[k], stored[k].to(state[k].dtype)) for k in state)
    # predict writes the task's records
    spec = task_spec(name)
    out = folder / f"predictions{spec.prediction_suffix}"
    records = predict(result.best_checkpoint, split="test", out=out)
    assert records and out.is_file() and out.stat().st_size > 0


def test_resume_ends_as_the_uninterrupted_run(tiny):
    _, config, folder = tiny
    whole = train(config, run_dir=folder / "whole")
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=folder / "cut", callbacks=[_Interrupt()])
    resumed = train({}, resume=folder / "cut")
    assert resumed.epochs == whole.epochs
    assert resumed.validation == whole.validation and resumed.test == whole.test
    last = {p: read_checkpoint(r / "checkpoints" / "last.safetensors")["state_dict"]
            for p, r in (("whole", whole.run_dir), ("cut", resumed.run_dir))}
    assert all(torch.equal(last["whole"][k], last["cut"][k]) for k in last["whole"])


def test_an_unknown_key_of_the_task_is_refused_by_name(tiny, capsys):
    name, config, folder = tiny
    where, typo = TYPO[name]
    node = config
    for part in where.split("."):
        node = node[part]
    node[typo] = 1
    path = folder / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(path)]) == EXIT_INPUT
    assert f"unknown config key '{where}.{typo}'" in capsys.readouterr().err


def test_a_diverging_run_exits_with_the_divergence_code(tiny, capsys):
    _, config, folder = tiny
    config["optim"] = {**config.get("optim", {}), "lr": 1e30}
    path = folder / "diverge.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(path), "--out", str(folder / "diverged")]) == EXIT_DIVERGED
    assert "became NaN or Inf" in capsys.readouterr().err


def test_compare_over_seeds_gives_one_mean_and_std_table(tmp_path):
    """polyfuse compare on a task type with its own model section (retrieval): the
    entries' sections replace the base's, and one table has a row per entry."""
    config = TINY["retrieval"](tmp_path)
    config["trainer"]["max_epochs"] = 1
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(config))
    entries = []
    for fusion in ("mean", "concat"):
        entry = {"retrieval": {**config["retrieval"], "fusion": fusion}}
        path = tmp_path / f"{fusion}.yaml"
        path.write_text(yaml.safe_dump(entry))
        entries.append(str(path))
    out = tmp_path / "compare"
    assert main(["compare", "--config", str(base), "--models", ",".join(entries), "--seeds", "2",
                 "--out", str(out), "--quiet", "--no-progress"]) == 0
    table = (out / "summary.md").read_text()
    assert "| mean (n=2) |" in table and "| concat (n=2) |" in table
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 4
    for fusion in ("mean", "concat"):
        for seed in (0, 1):
            saved = yaml.safe_load((out / fusion / f"seed{seed}" / "config.yaml").read_text())
            assert saved["retrieval"]["fusion"] == fusion and saved["seed"] == seed
