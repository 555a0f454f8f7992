"""``polyfuse bench ddp``: wall time per epoch of every task type with 1 and 2 processes.

Each task type trains on synthetic data written into a scratch folder (small but not
trivial: an epoch takes about a second on one core), once with 1 process and once with
2 (DDP, gloo on CPU), the same global batch, each run a fresh process started as
``python -m polyfuse.bench.ddp --worker CONFIG RUN_DIR TIMES`` (Lightning starts the
second process with the same command). A callback in the run records when every epoch
starts and when training ends: an epoch's time covers its training steps, its
validation and its checkpoints. The first ``warmup_epochs`` epochs are left out (the
first collective calls, lazy initialisation); ``seconds_per_epoch`` is the median of
the others, and ``ratio`` the 2-process time over the 1-process time.

The ratio is not a target: on the 2-core machine of docs/BENCHMARKS.md the two
processes share the cores with everything else, and with one thread each they can at
best halve the step time of compute-bound work, while the gradient all-reduce and the
task's own gathers add to it. The machine's load is recorded with the result
(``load``; ``children`` is the CPU time of the training processes, which ``own`` leaves
out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.bench.measure import LoadMonitor
from polyfuse.bench.results import result_header

__all__ = ["FULL", "QUICK", "TASKS", "DDPBenchSettings", "ddp_markdown", "run_ddp_bench", "task_config"]

TASKS = ("sentiment", "traits", "classification", "vqa", "captioning", "retrieval", "chimera", "grounding")
_WORDS = ("dog", "cat", "car", "man", "ball", "tree", "runs", "sits", "jumps", "a", "the", "red")


@dataclasses.dataclass(frozen=True)
class DDPBenchSettings:
    tasks: tuple[str, ...] = TASKS
    epochs: int = 4
    warmup_epochs: int = 1
    scale: float = 1.0  # multiplies the number of samples of every task's data
    repeats: int = 1  # 1 and 2 processes in turns (1, 2, 1, 2, ...); the median over repeats
    seed: int = 0
    timeout_s: float = 900.0


FULL = DDPBenchSettings()
QUICK = dataclasses.replace(FULL, tasks=("sentiment",), epochs=2, scale=0.1)


def _count(scale: float, full: int, least: int) -> int:
    return max(least, round(full * scale))


def _trainer(epochs: int) -> dict[str, Any]:
    return {"max_epochs": epochs, "patience": 0, "accelerator": "cpu", "progress_bar": False, "quiet": True,
            "num_threads": 1, "log_every_n_steps": 50}


def _tabular(task: dict[str, Any], label: Callable[[np.ndarray], np.ndarray]) -> Callable[..., dict[str, Any]]:
    """The writer of a tabular task type: three modalities of 20 steps, ``label`` of the
    planted signal (the product of one feature of two modalities)."""

    def write(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
        samples = _count(scale, 3200, 40)
        rng = np.random.default_rng(0)
        a, b, c = (rng.normal(size=(samples, 20, d)).astype(np.float32) for d in (32, 16, 8))
        signal = a[:, :, 0].mean(1) * b[:, :, 1].mean(1) * 10
        train, val = int(samples * 0.7), int(samples * 0.15)
        split = np.array(["train"] * train + ["val"] * val + ["test"] * (samples - train - val))
        np.savez(folder / "tabular.npz", a=a, b=b, c=c, label=label(signal), split=split)
        return {"task": dict(task),
                "data": {"source": str(folder / "tabular.npz"), "modalities": ["a", "b", "c"], "split": "split",
                         "batch_size": 32},
                "model": {"fusion": "man", "fusion_dim": 32, "out_dim": 32, "dropout": 0.0,
                          "encoder": {"hidden_dim": 32, "dropout": 0.0}}}

    return write


def _vqa(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
    import h5py

    rng = np.random.default_rng(0)
    questions = (("what color is the shape?", "color"), ("is the shape red?", "yes/no"))
    for split, images in (("train", _count(scale, 1800, 8)), ("test", _count(scale, 450, 4))):
        features = rng.normal(size=(images, 16, 32)).astype(np.float16) * 0.1
        asked, answered = [], []
        for image in range(images):
            red = image % 2 == 1
            features[image, :, 0] = 1.0 if red else -1.0
            for k, (text, kind) in enumerate(questions):
                answer = ("red" if red else "blue") if kind == "color" else ("yes" if red else "no")
                asked.append({"question_id": 10 * image + k, "image_id": image, "question": text})
                answered.append({"question_id": 10 * image + k, "image_id": image, "question_type": kind,
                                 "answer_type": "yes/no" if kind == "yes/no" else "other",
                                 "answers": [{"answer": answer}] * 9 + [{"answer": "green"}]})
        (folder / f"{split}_questions.json").write_text(json.dumps({"questions": asked}))
        (folder / f"{split}_annotations.json").write_text(json.dumps({"annotations": answered}))
        with h5py.File(folder / f"{split}.h5", "w") as handle:
            corners = rng.uniform(size=(images, 16, 2)).astype(np.float32)
            handle["features"], handle["boxes"] = features, np.concatenate([corners, corners + 0.1], axis=-1)
            handle["image_ids"] = np.arange(images)
    files = {f"{s}_{kind}": str(folder / f"{s}_{kind}.json") for s in ("train", "test") for kind in ("questions", "annotations")}
    return {"task": {"type": "vqa"},
            "data": {"batch_size": 32, "validation_fraction": 0.2,
                     "vqa": {**files, "train_features": str(folder / "train.h5"), "test_features": str(folder / "test.h5"),
                             "min_answer_count": 1, "breakdown": "question_type"}},
            "model": {"fusion": "ban", "options": {"ban": {"glimpses": 2, "dropout": 0.0, "attention_dropout": 0.0}},
                      "vqa": {"hidden_dim": 32, "embedding_dim": 32, "counter_objects": 8, "classifier_dropout": 0.0}},
            "optim": {"lr": 0.002}}


def _captions(video: int) -> list[str]:
    kind = video % 6
    return [f"a {_WORDS[kind]} {_WORDS[6 + video % 3]} here", f"the {_WORDS[kind]} {_WORDS[6 + (video + 1) % 3]}"]


def _captioning(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
    videos = _count(scale, 1080, 12)
    rng = np.random.default_rng(0)
    ids = [f"vid{i:04d}" for i in range(videos)]
    np.savez(folder / "appearance.npz", **{v: (rng.normal(size=(8, 32)) + i % 6).astype(np.float32) for i, v in enumerate(ids)})
    np.savez(folder / "motion.npz", video_ids=np.array(ids), flow=rng.normal(size=(videos, 6, 16)).astype(np.float16))
    (folder / "captions.json").write_text(json.dumps({v: _captions(i) for i, v in enumerate(ids)}))
    train, val = int(videos * 0.8), int(videos * 0.1)
    (folder / "splits.json").write_text(json.dumps({"train": ids[:train], "val": ids[train:train + val],
                                                    "test": ids[train + val:]}))
    return {"task": {"type": "captioning", "label_smoothing": 0.1},
            "data": {"batch_size": 32, "eval_batch_size": 16},
            "captioning": {"features": {"appearance": str(folder / "appearance.npz"),
                                        "motion": str(folder / "motion.npz") + "#flow"},
                           "captions": str(folder / "captions.json"), "splits": str(folder / "splits.json"),
                           "min_count": 1, "beam_size": 2, "max_length": 8, "meteor": False},
            "decoder": {"variant": "L-HOCA-UBT", "feature_dim": 32, "embed_dim": 32, "hidden_dim": 64,
                        "attention_dim": 16, "dropout": 0.0},
            "optim": {"lr": 0.005}}


def _retrieval(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
    videos = _count(scale, 9600, 60)
    return {"task": {"type": "retrieval"},
            "retrieval": {"source": f"synthetic:videos={videos},steps=8,events=4,dim=32", "text": "bow",
                          "embed_dim": 32, "hidden_dim": 32},
            "model": {"fusion": "man"},
            "data": {"batch_size": 32, "eval_batch_size": 64}}


def _tiny_bert(folder: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocabulary = {word: i for i, word in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS, "here"])}
    BertTokenizerFast(vocab=vocabulary).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocabulary), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    BertModel(config).save_pretrained(folder)
    return folder


def _chimera(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
    videos = _count(scale, 600, 12)
    rng = np.random.default_rng(1)
    ids = [f"v{i:04d}" for i in range(videos)]
    features = rng.standard_normal((videos, 8, 32)).astype("float32")
    features[:, :, 0] += np.arange(videos)[:, None] % 6
    np.savez(folder / "app.npz", video_ids=np.array(ids), features=features)
    (folder / "captions.json").write_text(json.dumps({v: _captions(i) for i, v in enumerate(ids)}))
    train, val = int(videos * 0.8), int(videos * 0.1)
    parts = {"train": ids[:train], "val": ids[train:train + val], "test": ids[train + val:]}
    for name, part in parts.items():
        (folder / f"{name}.txt").write_text("\n".join(part) + "\n")
    (folder / "bert").mkdir(exist_ok=True)
    return {"task": {"type": "chimera"},
            "chimera": {"experts": {"app": str(folder / "app.npz")}, "captions": str(folder / "captions.json"),
                        "splits": {n: str(folder / f"{n}.txt") for n in parts},
                        "encoder_path": str(_tiny_bert(folder / "bert")), "num_topics": 4, "hyperbolic_dim": 4},
            "data": {"batch_size": 16, "eval_batch_size": 32}}


def _grounding(folder: Path, scale: float, epochs: int) -> dict[str, Any]:
    from polyfuse.data.synthetic_flickr30k import write_flickr30k_like

    written = write_flickr30k_like(folder / "flickr30k", images=_count(scale, 600, 12))
    return {"task": {"type": "grounding"},
            "data": {"batch_size": 32, "eval_batch_size": 64,
                     "grounding": {"entities": str(written.folder), "features": str(written.features),
                                   "features_index": str(written.index)}},
            "model": {"fusion": "ban", "grounding": {"hidden_dim": 32, "embedding_dim": 32},
                      "options": {"ban": {"glimpses": 1, "dropout": 0.0, "attention_dropout": 0.0}}},
            "optim": {"lr": 0.002}}


_WRITERS: dict[str, Callable[[Path, float, int], dict[str, Any]]] = {
    "sentiment": _tabular({"type": "sentiment"}, lambda signal: np.clip(3 * signal, -3, 3)),
    "traits": _tabular({"type": "traits", "target_ranges": [[1, 7], [1, 7]]},
                       lambda signal: np.stack([signal, -signal], 1).clip(-1, 1) * 3 + 4),
    "classification": _tabular({"type": "classification"}, lambda signal: np.digitize(signal, [-0.1, 0.1])),
    "vqa": _vqa,
    "captioning": _captioning,
    "retrieval": _retrieval,
    "chimera": _chimera,
    "grounding": _grounding,
}


def task_config(name: str, folder: Path, *, scale: float = 1.0, epochs: int = 4, seed: int = 0) -> dict[str, Any]:
    """The benchmark's configuration of task type ``name``, its data written into ``folder``."""
    if name not in _WRITERS:
        raise ValueError(f"bench ddp: unknown task type {name!r}; known: {', '.join(TASKS)}")
    folder.mkdir(parents=True, exist_ok=True)
    config = _WRITERS[name](folder, scale, epochs)
    return {**config, "seed": seed, "output_dir": str(folder / "runs"), "trainer": _trainer(epochs)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(config_path: Path, run_dir: Path, processes: int, timeout_s: float) -> dict[str, Any]:
    """One training run in fresh processes; its epoch times (process 0's)."""
    times = run_dir.with_suffix(".times.json")
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK")}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1",
                       POLYFUSE_BENCH_PROCESSES=str(processes))
    command = [sys.executable, "-m", "polyfuse.bench.ddp", "--worker", str(config_path), str(run_dir), str(times)]
    start = time.perf_counter()
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - start
    if finished.returncode != 0:
        raise RuntimeError(f"bench ddp: the {processes}-process run of {config_path} failed "
                           f"(exit {finished.returncode}):\n{finished.stderr[-3000:]}")
    return {**json.loads(times.read_text()), "wall_seconds": wall}


def run_ddp_bench(
    settings: DDPBenchSettings = FULL, *, folder: Path | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Every task type of ``settings.tasks`` trained with 1 and with 2 processes; seconds per epoch and their ratio."""
    unknown = [name for name in settings.tasks if name not in _WRITERS]
    if unknown:
        raise ValueError(f"bench ddp: unknown task type(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    if settings.epochs <= settings.warmup_epochs:
        raise ValueError("bench ddp: epochs must exceed warmup_epochs (the warm-up epochs are not timed)")
    payload = result_header("ddp", dataclasses.asdict(settings))
    rows = []
    with tempfile.TemporaryDirectory(prefix="polyfuse-bench-ddp-") as scratch, LoadMonitor() as load:
        children = _children_cpu_seconds()
        root = Path(folder) if folder is not None else Path(scratch)
        for name in settings.tasks:
            work = root / name
            config = task_config(name, work, scale=settings.scale, epochs=settings.epochs, seed=settings.seed)
            path = work / "bench.yaml"
            path.write_text(_dump(config))
            runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
            for repeat in range(settings.repeats):
                for processes in (1, 2):
                    runs[processes].append(_run(path, work / f"run{processes}-{repeat}", processes, settings.timeout_s))
            row = _row(name, runs, settings.warmup_epochs)
            rows.append(row)
            if progress:
                progress(f"{name}: {row['one_process']['seconds_per_epoch']:.2f} s/epoch with 1 process, "
                         f"{row['two_processes']['seconds_per_epoch']:.2f} with 2 (ratio {row['ratio']:.2f})")
        children = _children_cpu_seconds() - children
    result = load.result()
    if result.get("machine_busy") is not None and result["seconds"] > 0:
        result["children"] = min(children / (result["seconds"] * result["cpus"]), 1.0)
        result["others"] = max(result["machine_busy"] - result["own"] - result["children"], 0.0)
    payload["rows"], payload["load"] = rows, result
    return payload


def _row(name: str, runs: dict[int, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    row: dict[str, Any] = {"task": name}
    for processes, key in ((1, "one_process"), (2, "two_processes")):
        timed = [run["epoch_seconds"][warmup:] for run in runs[processes]]
        per_repeat = [statistics.median(epochs) for epochs in timed]
        row[key] = {
            "seconds_per_epoch": statistics.median(per_repeat),
            "epoch_seconds": [run["epoch_seconds"] for run in runs[processes]],
            "steps_per_epoch": runs[processes][0]["steps_per_epoch"],
            "world_size": runs[processes][0]["world_size"],
            "wall_seconds": [run["wall_seconds"] for run in runs[processes]],
        }
    row["ratio"] = row["two_processes"]["seconds_per_epoch"] / row["one_process"]["seconds_per_epoch"]
    return row


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _dump(config: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)


def ddp_markdown(payload: dict[str, Any], command: str) -> str:
    """The section of docs/BENCHMARKS.md (written to docs/benchmarks/ddp.md)."""
    settings, load, machine = payload["settings"], payload.get("load") or {}, payload["machine"]
    busy = load.get("machine_busy")
    repeats = "" if settings["repeats"] == 1 else f" and over {settings['repeats']} repeats (1, 2, 1, 2, ... processes)"
    warmup = "epoch" if settings["warmup_epochs"] == 1 else f"{settings['warmup_epochs']} epochs"
    load_text = (
        f"machine busy {100 * busy:.0f}% of all CPUs, the training processes {100 * load.get('children', 0):.0f}%, "
        f"other processes {100 * load['others']:.0f}%, load average {load['loadavg_1min']:.2f} at the end"
        if busy is not None else "load not recorded"
    )
    lines = [
        "## Data parallel: seconds per epoch with 1 and 2 processes",
        "",
        "```bash",
        command,
        "python scripts/write_benchmarks_md.py",
        "```",
        "",
        f"Every task type on synthetic data written by `polyfuse.bench.ddp` (scale {settings['scale']:g}), "
        f"{settings['epochs']} epochs, trained with 1 process and with 2 (DDP, gloo, one thread "
        f"each, the same global batch), each run a fresh `python -m polyfuse.bench.ddp --worker` process; "
        f"an epoch's time covers its training steps, validation and checkpoints; the first "
        f"{warmup} left out, the median of the others"
        f"{repeats}. "
        f"Ratio: 2 processes over 1 (below 1: faster). Not a target: the machine has "
        f"{machine['logical_cpus']} logical CPUs ({machine['cpu']}), shared with other jobs.",
        "",
        f"Measured {payload['created']} (polyfuse {payload['polyfuse']}, torch {machine['torch']}); {load_text}.",
        "",
        "| task | steps per epoch (1 / 2 processes) | 1 process s/epoch | 2 processes s/epoch | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in payload["rows"]:
        one, two = row["one_process"], row["two_processes"]
        lines.append(f"| {row['task']} | {one['steps_per_epoch']} / {two['steps_per_epoch']} | "
                     f"{one['seconds_per_epoch']:.2f} | {two['seconds_per_epoch']:.2f} | {row['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def _worker(config_path: Path, run_dir: Path, times: Path) -> int:
    """Train ``config_path`` into ``run_dir`` with POLYFUSE_BENCH_PROCESSES processes; process 0
    writes the epoch times to ``times``."""
    import yaml
    from lightning.pytorch.callbacks import Callback

    from polyfuse.engine import train

    class EpochTimes(Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.starts.append(time.perf_counter())

        def on_train_end(self, trainer: Any, module: Any) -> None:
            if trainer.is_global_zero:
                ends = [*self.starts[1:], time.perf_counter()]
                epochs = len(self.starts)
                content = {"epoch_seconds": [end - start for start, end in zip(self.starts, ends, strict=True)],
                           "steps_per_epoch": trainer.global_step // max(epochs, 1), "world_size": trainer.world_size}
                times.write_text(json.dumps(content))

    processes = int(os.environ.get("POLYFUSE_BENCH_PROCESSES", "1"))
    config = yaml.safe_load(config_path.read_text())
    config["trainer"] = {**config["trainer"], "devices": processes, "strategy": "ddp" if processes > 1 else "auto"}
    train(config, run_dir=run_dir, callbacks=[EpochTimes()])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one timed run of polyfuse bench ddp (started by the benchmark)")
    parser.add_argument("--worker", nargs=3, type=Path, metavar=("CONFIG", "RUN_DIR", "TIMES"), required=True)
    args = parser.parse_args(argv)
    return _worker(*args.worker)


if __name__ == "__main__":
    sys.exit(main())
