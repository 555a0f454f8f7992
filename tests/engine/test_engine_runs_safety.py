"""Runs never lose or mix data: locked run directories, unique temporary files,
atomic writes, resuming a moved run, refusal of wrong or broken checkpoints."""

import json
import shutil
import warnings

import pytest
import torch
from tests.helpers.runs import Interrupt
from tests.tiny.synthetic import engine_config

from polyfuse.engine import read_checkpoint, train
from polyfuse.engine.checkpoints import write_checkpoint
from polyfuse.engine.run import load_model
from polyfuse.engine.rundir import RunDirLock, atomic_temp_path, atomic_write_text, claim_run_dir


def test_a_locked_run_directory_is_refused(tiny_config, tmp_path):
    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    held = RunDirLock(run_dir)  # another process training there
    try:
        with pytest.raises(ValueError, match="in use by another polyfuse process"):
            train(tiny_config(), run_dir=run_dir)
    finally:
        held.release()
    assert not (run_dir / "config.yaml").exists()  # nothing of the refused run was written


def test_generated_names_give_fresh_directories(tmp_path):
    first, lock_a = claim_run_dir(tmp_path / "runs" / "man", generated=True)
    second, lock_b = claim_run_dir(tmp_path / "runs" / "man", generated=True)
    assert (first.name, second.name) == ("man", "man_1")
    lock_a.release()
    lock_b.release()


def test_a_user_named_directory_with_a_run_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("seed: 0\n")
    with pytest.raises(ValueError, match="already holds a run; continue it with --resume"):
        claim_run_dir(run_dir, generated=False)
    path, lock = claim_run_dir(run_dir, generated=False, fresh=False)  # resuming it is fine
    lock.release()
    assert path == run_dir


def test_temporary_files_are_unique_and_a_failed_write_keeps_the_old_file(tmp_path):
    with atomic_temp_path(tmp_path / "other.json") as one, atomic_temp_path(tmp_path / "other.json") as two:
        assert one != two and one.parent == two.parent == tmp_path
        one.write_text("1")
        two.write_text("2")
    (tmp_path / "other.json").unlink()
    target = tmp_path / "results.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_temp_path(target) as temp:
        temp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no partial left behind


def test_checkpoint_writes_use_unique_partial_names(tmp_path, monkeypatch):
    seen = []
    import polyfuse.engine.checkpoints as checkpoints

    original = checkpoints.save_file

    def spy(tensors, name, metadata):
        seen.append(name)
        original(tensors, name, metadata=metadata)

    monkeypatch.setattr(checkpoints, "save_file", spy)
    write_checkpoint({"w": torch.ones(2)}, tmp_path / "last.safetensors")
    write_checkpoint({"w": torch.zeros(2)}, tmp_path / "last.safetensors")
    assert len(set(seen)) == 2 and all(name.endswith(".partial") for name in seen)
    assert torch.equal(read_checkpoint(tmp_path / "last.safetensors")["w"], torch.zeros(2))


def test_a_moved_run_resumes_to_the_same_numbers(tiny_config, tmp_path):
    config = tiny_config(trainer={"max_epochs": 4, "patience": 0})
    whole = train(config, run_dir=tmp_path / "whole")
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=tmp_path / "cut", callbacks=[Interrupt(2)])
    shutil.move(tmp_path / "cut", tmp_path / "moved")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dirpath has changed.*")  # the best score would be lost
        resumed = train({}, resume=tmp_path / "moved")
    assert resumed.validation == whole.validation and resumed.test == whole.test
    assert resumed.best_checkpoint.parent == tmp_path / "moved" / "checkpoints"
    saved = json.loads((tmp_path / "moved/results.json").read_text())
    assert saved["best_checkpoint"] == "checkpoints/best.safetensors"


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("one")
    train(engine_config(base, trainer={"max_epochs": 1}), run_dir=base / "run")
    return base / "run"


def broken_copy(run, tmp_path, change):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    last = copy / "checkpoints" / "last.safetensors"
    checkpoint = read_checkpoint(last)
    change(checkpoint)
    write_checkpoint(checkpoint, last)
    return copy


def _nan_weight(checkpoint):
    name = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point())
    checkpoint["state_dict"][name] = torch.full_like(checkpoint["state_dict"][name], float("nan"))


def _other_model(checkpoint):
    name = next(k for k in checkpoint["state_dict"] if k.endswith("weight"))
    checkpoint["state_dict"][name] = torch.zeros(3, 3)


def _nan_stats(checkpoint):
    stats = checkpoint["polyfuse"]["stats"]
    stats[next(iter(stats))]["std"][0] = float("nan")


def _no_config(checkpoint):
    del checkpoint["polyfuse"]["config"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_nan_weight, "holds NaN or Inf"),
        (_other_model, "its weights belong to another model"),
        (_nan_stats, "stored feature std of 'm0' holds NaN"),
        (_no_config, "metadata lacks config"),
    ],
)
def test_resume_refuses_wrong_or_broken_checkpoints(one_epoch_run, tmp_path, change, message):
    copy = broken_copy(one_epoch_run, tmp_path, change)
    with pytest.raises(ValueError, match=message):
        train({"trainer": {"max_epochs": 2}}, resume=copy)
    assert not (copy / "results.json").exists() or (copy / "results.json").read_text() == (
        one_epoch_run / "results.json"
    ).read_text()


@pytest.mark.parametrize(("change", "message"), [(_nan_weight, "holds NaN or Inf"), (_no_config, "metadata lacks config")])
def test_loading_refuses_broken_checkpoints(one_epoch_run, tmp_path, change, message):
    copy = broken_copy(one_epoch_run, tmp_path, change)
    with pytest.raises(ValueError, match=message):
        load_model(copy / "checkpoints" / "last.safetensors")


def test_metrics_csv_is_replaced_atomically(tmp_path, monkeypatch):
    import csv

    import polyfuse.engine.logs as logs
    from polyfuse.engine.logs import AtomicExperimentWriter

    writer = AtomicExperimentWriter(str(tmp_path / "csv"))
    writer.log_metrics({"train/loss": 1.0}, step=0)
    writer.save()
    before = (tmp_path / "csv" / "metrics.csv").read_text()
    # A new column makes Lightning's writer truncate and rewrite the file; a crash then lost every row.
    writer.log_metrics({"train/loss": 0.5, "val/loss": 0.7}, step=1)

    def crash(path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(logs, "atomic_temp_path", crash)
    with pytest.raises(OSError):
        writer.save()
    assert (tmp_path / "csv" / "metrics.csv").read_text() == before
    monkeypatch.undo()
    writer.save()
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    assert [(r["step"], r["train/loss"], r["val/loss"]) for r in rows] == [("0", "1.0", ""), ("1", "0.5", "0.7")]
