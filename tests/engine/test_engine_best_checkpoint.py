"""The best checkpoint holds what using the model needs, the last one what resuming needs
(issue 41: a captioning run's best carried Adam's state, doubling its size)."""

from __future__ import annotations

import json

import pytest
import torch

from polyfuse.engine.checkpoints import (
    RESUME_ONLY_KEYS,
    SafetensorsModelCheckpoint,
    check_resumable,
    read_checkpoint,
)
from polyfuse.engine.run import evaluate, load_model, train


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def test_the_monitored_checkpoint_writes_weights_only_unless_told():
    assert SafetensorsModelCheckpoint(monitor="val/loss").save_weights_only
    assert not SafetensorsModelCheckpoint(monitor=None).save_weights_only
    assert not SafetensorsModelCheckpoint(monitor="val/loss", save_weights_only=False).save_weights_only


@pytest.mark.parametrize("name", ["captioning", "vqa"])
def test_best_holds_weights_and_extras_last_everything(name, tmp_path, tiny_task):
    result = train(tiny_task(name), run_dir=tmp_path / "run")
    best_path = result.run_dir / "checkpoints" / "best.safetensors"
    last_path = result.run_dir / "checkpoints" / "last.safetensors"
    best, last = read_checkpoint(best_path), read_checkpoint(last_path)
    assert not set(RESUME_ONLY_KEYS) & set(best)
    assert set(RESUME_ONLY_KEYS) <= set(last) and last["optimizer_states"][0]["state"]  # Adam's moments
    assert {"state_dict", "polyfuse", "epoch", "global_step"} <= set(best)
    assert best["polyfuse"].keys() == last["polyfuse"].keys()
    # Adam's two moments per weight are no longer in best: last is larger by at least their bytes
    moments = _tensor_bytes(last["optimizer_states"])
    assert moments > _tensor_bytes(best["state_dict"])
    assert last_path.stat().st_size - best_path.stat().st_size >= moments
    # the best epoch's weights, which load, evaluate and the run's own test read
    assert json.loads((result.run_dir / "results.json").read_text())["best_checkpoint"] == "checkpoints/best.safetensors"
    module, _ = load_model(best_path)
    assert all(torch.equal(module.state_dict()[k], v.to(module.state_dict()[k].dtype)) for k, v in best["state_dict"].items())
    assert evaluate(best_path, split="test") == pytest.approx(result.test, rel=1e-5, abs=1e-6)
    # resuming reads last; best is refused by name, before Lightning's KeyError
    check_resumable(last_path)
    with pytest.raises(ValueError, match=r"best\.safetensors holds the weights only .* resume from the run directory"):
        check_resumable(best_path)
