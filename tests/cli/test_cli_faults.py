"""Faults of the machine and odd requests from the command line: one line naming the
path and what to do, documented exit codes, runs left resumable."""

import csv
import errno
import json
import signal

import numpy as np
import pytest

import polyfuse.engine.checkpoints as checkpoints
from polyfuse.cli.main import EXIT_DIVERGED, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_SYSTEM, main
from polyfuse.engine.seeding import ReseedEachEpoch

QUIET = ["--no-progress", "--quiet"]


def error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run (shared by the tests that only read it)."""
    import yaml
    from tests.tiny.synthetic import CLI_CONFIG

    folder = tmp_path_factory.mktemp("trained")
    (folder / "tiny.yaml").write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(folder / "runs")}))
    assert main(["train", "--config", str(folder / "tiny.yaml"), "--out", str(folder / "run"), *QUIET]) == 0
    return folder / "run"


def test_disk_full_while_checkpointing_leaves_a_resumable_run(config_file, tmp_path, capsys, monkeypatch):
    original, calls = checkpoints.save_file, []

    def fill_up(tensors, name, metadata):
        calls.append(name)
        if len(calls) == 3:  # epoch 0 wrote best and last; the disk fills at epoch 1
            with open(name, "wb") as handle:
                handle.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device", name)
        original(tensors, name, metadata=metadata)

    monkeypatch.setattr(checkpoints, "save_file", fill_up)
    run = tmp_path / "run"
    assert main(["train", "--config", str(config_file), "--out", str(run), *QUIET]) == EXIT_SYSTEM
    line = error_line(capsys)
    assert "the disk is full; free some space" in line and str(run / "checkpoints") in line
    assert f"can be resumed: polyfuse train --resume {run}" in line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.safetensors", "last.safetensors"]
    monkeypatch.setattr(checkpoints, "save_file", original)
    assert main(["train", "--resume", str(run), *QUIET]) == 0
    assert json.loads((run / "results.json").read_text())["resumed"] is True


def test_read_only_output_folder(config_file, tmp_path, capsys, monkeypatch):
    import polyfuse.engine.rundir as rundir

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ro" / "run.lock"))

    monkeypatch.setattr(rundir.os, "open", read_only)
    assert main(["train", "--config", str(config_file), "--out", str(tmp_path / "ro"), *QUIET]) == EXIT_SYSTEM
    line = error_line(capsys)
    assert line == (
        f"polyfuse train: error: cannot write or read {tmp_path / 'ro' / 'run.lock'}: "
        "the file system is read-only; write elsewhere (--out or output_dir)"
    )


def test_output_path_that_is_a_directory_and_permission_errors(trained, tmp_path, capsys, monkeypatch):
    checkpoint = str(trained / "checkpoints" / "best.safetensors")
    folder = tmp_path / "predictions.csv"
    folder.mkdir()
    assert main(["predict", "--checkpoint", checkpoint, "--out", str(folder)]) == EXIT_SYSTEM
    assert f"{folder}: it is a directory; give a file path" in error_line(capsys)
    import polyfuse.atomic as atomic

    def denied(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", denied)
    assert main(["predict", "--checkpoint", checkpoint, "--out", str(tmp_path / "p.csv")]) == EXIT_SYSTEM
    assert f"cannot write or read {tmp_path}: permission denied" in error_line(capsys)
    assert not (tmp_path / "p.csv").exists()


def test_ctrl_c_says_how_to_resume(config_file, tmp_path, capsys, monkeypatch):
    def interrupt(self, trainer, module):
        if trainer.current_epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(ReseedEachEpoch, "on_train_epoch_start", interrupt)
    run = tmp_path / "run"
    handler = signal.getsignal(signal.SIGINT)
    assert main(["train", "--config", str(config_file), "--out", str(run), *QUIET]) == EXIT_INTERRUPTED
    assert error_line(capsys) == (
        f"polyfuse train: error: interrupted; the run can be resumed with: polyfuse train --resume {run}"
    )
    assert signal.getsignal(signal.SIGINT) is handler  # Lightning's SIG_IGN is undone
    monkeypatch.undo()
    assert main(["train", "--resume", str(run), *QUIET]) == 0


def test_divergence_is_reported_as_divergence(config_file, tmp_path, capsys):
    code = main(["train", "--config", str(config_file), "--out", str(tmp_path / "r"), "--set", "optim.lr=1e30", *QUIET])
    assert code == EXIT_DIVERGED
    line = error_line(capsys)
    assert "became NaN or Inf at training step" in line and "lower the learning rate (optim.lr)" in line
    assert "contains NaN" not in line


def test_predict_edge_cases(trained, tmp_path, capsys):
    checkpoint = str(trained / "checkpoints" / "best.safetensors")
    rng = np.random.default_rng(0)
    features = {"a": rng.normal(size=(6, 6, 4)), "b": rng.normal(size=(6, 7, 3)), "c": rng.normal(size=(6, 8, 5))}
    no_labels = tmp_path / "other.npz"
    np.savez(no_labels, **{k: v.astype(np.float32) for k, v in features.items()}, split=np.array(["train"] * 6))
    out = tmp_path / "p.csv"
    # A checkpoint trained on synthetic data applied to an npz: name the arrays; labels are optional.
    assert main(["predict", "--checkpoint", checkpoint, "--data", str(no_labels), "--modalities", "a,b,c", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["row"] for r in rows] == [str(i) for i in range(6)] and "label" not in rows[0]
    assert main(["predict", "--checkpoint", checkpoint, "--data", str(no_labels), "--out", str(out)]) == EXIT_INPUT
    assert "no array 'm0' (wanted as a modality)" in error_line(capsys)
    assert main(["predict", "--checkpoint", checkpoint, "--data", str(no_labels), "--modalities", "a,b", "--out", str(out)]) == EXIT_INPUT
    assert "--modalities names 2 arrays ['a', 'b']; the checkpoint was trained on 3 modalities" in error_line(capsys)
    assert main(["predict", "--checkpoint", checkpoint, "--data", str(no_labels), "--modalities", "a,c,b", "--out", str(out)]) == EXIT_INPUT
    assert f"{no_labels}: modality 'c' has 5 features, the checkpoint was trained with 3" in error_line(capsys)


def test_predict_on_a_file_without_test_rows(tmp_path, capsys):
    import yaml
    from tests.tiny.synthetic import CLI_CONFIG

    rng = np.random.default_rng(1)
    path = tmp_path / "no_test.npz"
    np.savez(
        path, a=rng.normal(size=(40, 5, 4)).astype(np.float32), b=rng.normal(size=(40, 3)).astype(np.float32),
        label=np.arange(40) % 2, split=np.array(["train"] * 30 + ["val"] * 10),
    )
    config = {**CLI_CONFIG, "data": {**CLI_CONFIG["data"], "source": str(path), "modalities": ["a", "b"], "split": "split"},
              "trainer": {**CLI_CONFIG["trainer"], "max_epochs": 1}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), *QUIET]) == 0
    capsys.readouterr()
    checkpoint = str(tmp_path / "run" / "checkpoints" / "best.safetensors")
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", checkpoint, "--split", "test", "--out", str(out)]) == EXIT_INPUT
    line = error_line(capsys)
    assert f"the 'test' split of {path} has no rows; choose --split all or one of: train, val" in line
    assert main(["predict", "--checkpoint", checkpoint, "--out", str(out)]) == 0  # every row
    assert len(list(csv.DictReader(out.open()))) == 40
