"""Data parallel started by torchrun or SLURM's srun, which start every process themselves
(Lightning starts none): the process of global rank 0 claims, locks and writes the run
directory given with ``--out``, the others write nothing of their own (no second run
directory, config.yaml, data hashes, logs or printed results), and the run gives the numbers
of the same run started by Lightning. Without ``--out`` the processes could not agree on a
generated name: every one refuses, naming the flag, before anything is written.

srun is simulated: its variables (SLURM_NTASKS, SLURM_PROCID, ...) set by hand, one
process each (Lightning's SLURMEnvironment reads nothing else)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.helpers.ports import free_port
from tests.tiny.tasks import TINY

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
MESSAGE = "the processes started by torchrun or srun must share one run directory: give it with --out DIR"


def _environment(**extra: str) -> dict[str, str]:
    names = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")
    environment = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("SLURM_")}
    return {**environment, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", **extra}


def _train(config: Path, out: Path | None) -> list[str]:
    return ["-m", "polyfuse.cli.main", "train", "--config", str(config), "--devices", "2", "--strategy", "ddp",
            *(["--out", str(out)] if out else [])]


def _torchrun(config: Path, out: Path | None) -> subprocess.CompletedProcess:
    command = [TORCHRUN, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               *_train(config, out)]
    return subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=240)


def _srun(config: Path, out: Path | None) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    processes = [
        subprocess.Popen([sys.executable, *_train(config, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_environment(
                             MASTER_PORT=port, SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_NNODES="1",
                             SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_JOB_ID="4242",
                             SLURM_JOB_NAME="polyfuse", SLURM_NODELIST="127.0.0.1"))
        for rank in (0, 1)
    ]
    finished = []
    for process in processes:
        out_text, err_text = process.communicate(timeout=240)
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, out_text, err_text))
    return finished


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("launchers")
    config = TINY["sentiment"](folder)
    config["model"] = {**config["model"], "dropout": 0.0, "encoder": {"hidden_dim": 8, "dropout": 0.0}}
    config["trainer"] = {**config["trainer"], "max_epochs": 2}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


RUN_FILES = ["checkpoints/best.safetensors", "checkpoints/last.safetensors", "config.yaml", "csv/version_0/metrics.csv",
             "data_hashes.json", "learning_curves.png", "results.json", "run.lock", "tensorboard/version_0/hparams.yaml"]


def _written(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and "events.out" not in p.name)


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed")
def test_torchrun_and_srun_write_one_run_directory(config: Path, tmp_path: Path) -> None:
    started = _torchrun(config, tmp_path / "torchrun")
    assert started.returncode == 0, started.stderr[-3000:]
    assert started.stdout.count("run directory:") == 1  # printed by rank 0 only
    ranks = _srun(config, tmp_path / "srun")
    assert [r.returncode for r in ranks] == [0, 0], ranks[1].stderr[-3000:] + ranks[0].stderr[-3000:]
    assert "run directory:" in ranks[0].stdout and ranks[1].stdout == ""
    lightning = subprocess.run([sys.executable, *_train(config, tmp_path / "lightning")], capture_output=True,
                               text=True, timeout=240, env=_environment(MASTER_PORT=str(free_port())))
    assert lightning.returncode == 0, lightning.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lightning", "srun", "torchrun"]
    results = {}
    for name in ("torchrun", "srun", "lightning"):
        assert _written(tmp_path / name) == RUN_FILES, name
        results[name] = json.loads((tmp_path / name / "results.json").read_text())
        assert results[name]["threads"]["processes"] == 2
    for name in ("torchrun", "srun"):
        assert results[name]["validation"] == pytest.approx(results["lightning"]["validation"], rel=1e-6, abs=1e-7)
        assert results[name]["test"] == pytest.approx(results["lightning"]["test"], rel=1e-6, abs=1e-7)


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed")
def test_without_out_every_process_refuses(config: Path, tmp_path: Path) -> None:
    runs = Path(yaml.safe_load(config.read_text())["output_dir"])
    before = sorted(runs.iterdir()) if runs.exists() else []
    started = _torchrun(config, None)
    assert started.returncode != 0 and started.stderr.count(MESSAGE) == 2
    ranks = _srun(config, None)
    assert all(r.returncode == 2 and MESSAGE in r.stderr for r in ranks)
    assert (sorted(runs.iterdir()) if runs.exists() else []) == before  # nothing written
