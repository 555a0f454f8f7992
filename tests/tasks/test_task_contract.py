"""The contract every registered task type keeps (as tests/nn/test_contract.py does for the
fusion modules): on tiny data, through the engine's one path,

- a training run writes config.yaml, results.json and safetensors checkpoints only;
- ``evaluate`` on the best checkpoint gives the run's test numbers, ``predict`` its records;
- the checkpoint round-trips: the loaded module holds the file's weights;
- an interrupted run resumed from its last checkpoint ends as the uninterrupted one;
- an unknown key of the task's configuration is refused, naming it;
- a run whose loss becomes NaN exits with the divergence code.

A new task type fails here until :data:`tests.tiny.tasks.TINY` gives it a tiny configuration and it passes.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from safetensors import safe_open
from tests.helpers.runs import Interrupt
from tests.tiny.tasks import TINY

from polyfuse.cli.main import EXIT_DIVERGED, EXIT_INPUT, main
from polyfuse.engine.checkpoints import read_checkpoint
from polyfuse.engine.config import resolve_config
from polyfuse.engine.run import evaluate, load_model, predict, train
from polyfuse.tasks.registry import available_tasks, task_spec

#: an unknown key in the task's own part of the configuration, and the known key it is close to
TYPO: dict[str, tuple[str, str]] = {
    "sentiment": ("data", "sourc"),
    "traits": ("data", "sourc"),
    "classification": ("data", "sourc"),
    "vqa": ("data.vqa", "train_feature"),
    "captioning": ("captioning", "caption"),
    "retrieval": ("retrieval", "embed_dims"),
    "chimera": ("chimera", "num_topic"),
    "grounding": ("data.grounding", "entity"),
}


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
    # the interrupted and resumed run reads its batches in 2 loader workers, the whole one
    # in the main process: batches depend on the seed and the epoch alone
    _, config, folder = tiny
    whole = train(config, run_dir=folder / "whole")
    config["data"] = {**config.get("data", {}), "loader_workers": 2}
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=folder / "cut", callbacks=[Interrupt(1)])
    resumed = train({}, resume=folder / "cut")
    assert resumed.epochs == whole.epochs
    assert resumed.validation == whole.validation and resumed.test == whole.test
    last = {p: read_checkpoint(r / "checkpoints" / "last.safetensors")["state_dict"]
            for p, r in (("whole", whole.run_dir), ("cut", resumed.run_dir))}
    assert all(torch.equal(last["whole"][k], last["cut"][k]) for k in last["whole"])


def test_loaders_run_the_workers_the_config_asks_for(tiny):
    name, config, _ = tiny
    config["data"] = {**config.get("data", {}), "loader_workers": 2}
    datamodule = task_spec(name).build_data(resolve_config(config)).datamodule
    loaders = [datamodule.train_dataloader(), datamodule.val_dataloader(), datamodule.test_dataloader()]
    assert [loader.num_workers for loader in loaders] == [2, 2, 2]


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
    """polyfuse compare on a task type with its own fusion names (retrieval's video
    fusions, model.fusion): one table with a row per fusion, a run per fusion and seed."""
    config = TINY["retrieval"](tmp_path)
    config["trainer"]["max_epochs"] = 1
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(config))
    out = tmp_path / "compare"
    assert main(["compare", "--config", str(base), "--models", "mean,concat", "--seeds", "2",
                 "--out", str(out), "--quiet", "--no-progress"]) == 0
    table = (out / "summary.md").read_text()
    assert "| mean (n=2) |" in table and "| concat (n=2) |" in table
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 4
    for fusion in ("mean", "concat"):
        for seed in (0, 1):
            saved = yaml.safe_load((out / fusion / f"seed{seed}" / "config.yaml").read_text())
            assert saved["model"]["fusion"] == fusion and saved["seed"] == seed
