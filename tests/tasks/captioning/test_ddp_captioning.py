"""Captioning under data parallel: 2 processes (DDP, gloo on CPU), each with its share of
every global batch, train, validate and test as 1 process with the same global batch
and seed: the same loss curves, validation loss, captions and caption metrics (within
1e-5: the processes' sums are added in another order) and weights (within 1e-4: Adam at
lr 0.05 turns the float32 rounding of the differently summed gradients into up to 2e-5
after 12 steps; the gradients themselves agree to rounding, tested in float64 below).
A resumed 2-process run ends as the uninterrupted one.

The batch sizes leave uneven shares and, at the end of every split, a global batch of
one (one process's share is empty): training 16 pairs in batches of 5, validation 4
pairs and test 4 videos in batches of 3. Dropout is 0: each process draws its own
masks, which one process would draw otherwise."""

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
from tests.tiny.captioning import captioning_config_file, write_captioning_data

from polyfuse.cli.main import EXIT_INTERRUPTED
from polyfuse.engine import load_config, read_checkpoint, resolve_config, seed_everything, train
from polyfuse.tasks.registry import task_spec

# The CLI, recording what each process saw; with POLYFUSE_TEST_INTERRUPT, Ctrl-C at the
# start of the second epoch. Lightning starts the second process with this same command.
DRIVER = """
import json, os, sys
from polyfuse.cli.main import main
from polyfuse.engine.seeding import ReseedEachEpoch
from polyfuse.tasks.captioning.spec import CaptioningTask

seen = {"train": [], "test": []}
training_step, test_end, reseed = CaptioningTask.training_step, CaptioningTask.on_test_epoch_end, ReseedEachEpoch.on_train_epoch_start

def record_step(self, batch, index):
    seen["train"].append([self.current_epoch, index, batch["token_share"], batch["global_size"], batch["videos"]])
    return training_step(self, batch, index)

def record_test(self):
    seen["test"] = [video for step in self._test_steps for video, _ in step]
    seen["world"] = self.trainer.world_size
    with open(os.path.join(os.environ["POLYFUSE_TEST_RECORD"], f"rank{self.global_rank}.json"), "w") as out:
        json.dump(seen, out)
    test_end(self)

def interrupt(self, trainer, module):
    if os.environ.get("POLYFUSE_TEST_INTERRUPT") and trainer.current_epoch == 1:
        raise KeyboardInterrupt
    reseed(self, trainer, module)

CaptioningTask.training_step, CaptioningTask.on_test_epoch_end = record_step, record_test
ReseedEachEpoch.on_train_epoch_start = interrupt
sys.exit(main(sys.argv[1:]))
"""


def _two_processes(folder: Path, *arguments: str, interrupt: bool = False) -> subprocess.CompletedProcess:
    driver = folder / "driver.py"
    driver.write_text(DRIVER)
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
                       POLYFUSE_TEST_RECORD=str(folder))
    if interrupt:
        environment["POLYFUSE_TEST_INTERRUPT"] = "1"
    return subprocess.run([sys.executable, str(driver), "train", *arguments], env=environment, cwd=folder,
                          capture_output=True, text=True, timeout=240)


def _logged(run: Path) -> dict[tuple[str, str], float]:
    """(epoch, key) -> value of every logged loss, over the CSV logs of every part of a run."""
    values = {}
    for path in sorted(run.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(path.open()):
            values.update({(row["epoch"], key): float(row[key]) for key in ("train/loss", "val/loss") if row.get(key)})
    return values


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data, a 2-process run ``two`` (its processes' records in ``two-records``) and a
    1-process run ``one`` of the same configuration."""
    folder = tmp_path_factory.mktemp("ddp_captioning")
    write_captioning_data(folder, videos=14)  # 8 training videos (16 pairs), 2 validation (4 pairs), 4 test
    path = captioning_config_file(folder)
    config = yaml.safe_load(path.read_text())
    config["data"] = {"batch_size": 5, "eval_batch_size": 3}
    config["optim"]["lr"], config["trainer"]["max_epochs"] = 0.05, 3  # captions that differ between videos
    path.write_text(yaml.safe_dump(config))
    (folder / "two-records").mkdir()
    finished = _two_processes(folder / "two-records", "--config", str(path), "--out", str(folder / "two"),
                              "--devices", "2", "--strategy", "ddp")
    assert finished.returncode == 0, finished.stderr[-3000:]
    train(load_config(path), run_dir=folder / "one")
    return folder


def test_two_processes_train_and_evaluate_as_one(runs: Path) -> None:
    two, one = (read_checkpoint(runs / name / "checkpoints/last.safetensors") for name in ("two", "one"))
    assert two["global_step"] == one["global_step"] == 3 * 4  # 3 epochs of 4 global batches (5, 5, 5, 1)
    for key, value in one["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][key], value, rtol=1e-4, atol=1e-4, msg=key)
    # The same loss curves (and the best checkpoint's validation loss, logged as epoch 3),
    # test loss, caption metrics and captions.
    logged = {name: _logged(runs / name) for name in ("two", "one")}
    assert logged["two"].keys() == logged["one"].keys() and len(logged["one"]) == 3 * 2 + 1
    assert logged["two"] == pytest.approx(logged["one"], rel=1e-5, abs=1e-6)
    results = {name: json.loads((runs / name / "results.json").read_text()) for name in ("two", "one")}
    assert results["two"]["validation"] == pytest.approx(results["one"]["validation"], rel=1e-5, abs=1e-6)
    assert results["two"]["test"].keys() == results["one"]["test"].keys() >= {"BLEU-4", "CIDEr-D", "ROUGE-L", "loss"}
    assert results["two"]["test"] == pytest.approx(results["one"]["test"], rel=1e-5, abs=1e-6)
    captions = {name: json.loads((runs / name / "test_captions.json").read_text()) for name in ("two", "one")}
    assert captions["two"] == captions["one"] and len(captions["one"]) == 4
    assert len({video["generated"] for video in captions["one"].values()}) > 1 and results["one"]["test"]["CIDEr-D"] > 0.5
    # The processes shared the batches: every global batch's token shares add up to one,
    # the last one of each epoch (one pair) left process 0 with an empty share (weight 0),
    # and the test videos were decoded half by each.
    ranks = [json.loads((runs / "two-records" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    steps = [[step[:2] for step in r["train"]] for r in ranks]
    assert steps[0] == steps[1] and len(steps[0]) == 12
    for zero, first in zip(ranks[0]["train"], ranks[1]["train"], strict=True):
        assert zero[2] + first[2] == pytest.approx(1.0, abs=1e-12) and zero[3] == first[3]
    assert [(s[2], s[3]) for s in ranks[0]["train"] if s[3] == 1] == [(0.0, 1)] * 3
    assert sorted(len(s[4]) for s in ranks[1]["train"]) == [1] * 3 + [3] * 9
    assert ranks[0]["test"] == ["vid10"] and ranks[1]["test"] == ["vid11", "vid12", "vid13"]
    # Training moved the weights well beyond the tolerance: the comparison has teeth.
    resolved = resolve_config(load_config(runs / "config.yaml"))
    seed_everything(int(resolved["seed"]))
    spec = task_spec("captioning")
    initial = spec.build_module(resolved, spec.build_data(resolved)).state_dict()
    moved = max((one["state_dict"][k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-2


def test_a_resumed_two_process_run_ends_as_the_uninterrupted_one(runs: Path) -> None:
    (runs / "cut-records").mkdir()
    cut = runs / "cut"
    interrupted = _two_processes(runs / "cut-records", "--config", str(runs / "config.yaml"), "--out", str(cut),
                                 "--devices", "2", "--strategy", "ddp", interrupt=True)
    assert interrupted.returncode == EXIT_INTERRUPTED, interrupted.stderr[-3000:]
    assert read_checkpoint(cut / "checkpoints/last.safetensors")["global_step"] == 4  # after epoch 1
    resumed = _two_processes(runs / "cut-records", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole, ended = (read_checkpoint(run / "checkpoints/last.safetensors") for run in (runs / "two", cut))
    assert ended["global_step"] == whole["global_step"]
    for key, value in whole["state_dict"].items():
        assert torch.equal(ended["state_dict"][key], value), key
    results = {run: json.loads((run / "results.json").read_text()) for run in (runs / "two", cut)}
    assert results[cut]["resumed"] and results[cut]["test"] == results[runs / "two"]["test"]
    assert _logged(cut) == _logged(runs / "two")


def test_the_shares_of_a_global_batch_give_its_loss_and_gradient(tmp_path: Path) -> None:
    """DDP averages the processes' gradients: the token-weighted losses of the shares of a
    global batch (uneven, or one empty) average to the loss of the whole batch, and their
    gradients to its gradient (float64: to rounding); the plain mean of the shares'
    per-token means does not (their token counts differ)."""
    from types import SimpleNamespace

    from polyfuse.nn.decoding import caption_cross_entropy
    from polyfuse.tasks.captioning.data import share_of

    write_captioning_data(tmp_path)
    resolved = resolve_config(load_config(captioning_config_file(tmp_path)))
    spec = task_spec("captioning")
    data = spec.build_data(resolved)
    task = spec.build_module(resolved, data).double()
    pairs, module = data.datamodule._pairs["train"], data.datamodule

    def loss_and_gradient(batch: dict, world: int) -> tuple[float, dict[str, torch.Tensor]]:
        task._trainer = SimpleNamespace(world_size=world)
        task.zero_grad()
        loss = task._loss({**batch, "inputs": [x.double() for x in batch["inputs"]]}, 0.1)
        loss.backward()
        return loss.item(), {k: p.grad.clone() for k, p in task.named_parameters()}

    assert share_of(list(range(5)), 0, 2) == [0, 1] and share_of(list(range(5)), 1, 2) == [2, 3, 4]
    for items in (pairs[:5], pairs[5:6]):  # uneven shares; one pair: process 0's share is empty
        whole, expected = loss_and_gradient(module._pair_batch(0, 1, items), 1)
        shares = [module._pair_batch(rank, 2, items) for rank in (0, 1)]
        assert [s["global_size"] for s in shares] == [len(items)] * 2
        assert sum(s["token_share"] for s in shares) == pytest.approx(1.0, abs=1e-12)
        losses, gradients = zip(*(loss_and_gradient(s, 2) for s in shares), strict=True)
        assert sum(losses) / 2 == pytest.approx(whole, rel=1e-6)  # the logits go through float32
        for key, value in expected.items():
            torch.testing.assert_close((gradients[0][key] + gradients[1][key]) / 2, value, rtol=1e-6, atol=1e-9)
    # Teeth: the shares of the first batch hold 9 and 14 target tokens, so the plain mean of
    # their per-token means is another number.
    shares = [module._pair_batch(rank, 2, pairs[:5]) for rank in (0, 1)]
    plain = [caption_cross_entropy(task.model(s["captions"], [x.double() for x in s["inputs"]], s["masks"]).float(),
                                   s["captions"][:, 1:], 0, 0.1).item() for s in shares]
    assert abs(sum(plain) / 2 - loss_and_gradient(module._pair_batch(0, 1, pairs[:5]), 1)[0]) > 1e-3
