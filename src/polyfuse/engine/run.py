"""Training, evaluation and prediction runs.

``train(config)`` writes, under the run directory::

    config.yaml            the resolved configuration, before training starts
    data_hashes.json       the sha256 of every data file the run reads; ``--resume``
                           refuses data that changed since (exit 2, naming the file)
    checkpoints/best.safetensors   best on the validation monitor
    checkpoints/last.safetensors   end of the last finished epoch (for --resume)
    csv/version_*/metrics.csv      per-epoch logs (a new version per resumed part)
    tensorboard/version_*/         the same for TensorBoard
    results.json           validation and test metrics of the best checkpoint, times
    learning_curves.png

The test partition is evaluated once, after training, with the best checkpoint.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from polyfuse import __version__
from polyfuse.data import FeatureStats, PreparedData
from polyfuse.data.datamodule import FusionDataModule
from polyfuse.engine.build import build_data, build_task, build_trainer, monitor_of
from polyfuse.engine.checkpoints import (
    check_extras,
    check_finite_state,
    checkpoint_epoch,
    load_state,
    read_checkpoint,
)
from polyfuse.engine.compat import defaults_then, warn_default_changes
from polyfuse.engine.config import data_files, dump_config, load_config, resolve_config
from polyfuse.engine.divergence import divergence_message
from polyfuse.engine.errors import DivergenceError, RunInterrupted
from polyfuse.engine.rundir import (
    RunDirLock,
    atomic_temp_path,
    atomic_write_text,
    check_data_hashes,
    claim_run_dir,
    record_data_hashes,
    safe_run_name,
)
from polyfuse.engine.seeding import seed_everything
from polyfuse.engine.threads import thread_plan_for
from polyfuse.tasks import FusionTask

__all__ = [
    "RunInterrupted",
    "RunResult",
    "data_for",
    "evaluate",
    "is_worker",
    "load_model",
    "partition_key",
    "predict",
    "prefixed_metrics",
    "quiet_trainer",
    "resolve_resume",
    "train",
]

DISPLAY_KEYS = ("progress_bar", "quiet")
RUN_DIR_ENV = "POLYFUSE_RUN_DIR"  # hands the run directory to DDP worker processes


@dataclass
class RunResult:
    """What a training run produced."""

    run_dir: Path
    best_checkpoint: Path
    validation: dict[str, float]
    test: dict[str, float]
    epochs: int
    train_seconds: float
    config: dict[str, Any] = field(default_factory=dict)
    #: the epoch (from 1) whose weights the best checkpoint holds; ``epochs`` were trained
    best_epoch: int | None = None


def is_worker() -> bool:
    """True in a DDP process other than the launching one (it re-runs the command)."""
    return int(os.environ.get("LOCAL_RANK", "0")) > 0 or int(os.environ.get("NODE_RANK", "0")) > 0


def _run_dir_path(config: Mapping[str, Any]) -> Path:
    """``output_dir/name``; the name can never point outside ``output_dir``."""
    name = safe_run_name(str(config["name"] or config["model"]["fusion"]))
    return Path(str(config["output_dir"])) / name


def _claim(config: Mapping[str, Any], run_dir: str | Path | None, resuming: bool) -> tuple[Path, RunDirLock | None]:
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited and is_worker():
        return Path(inherited), None
    if run_dir is None:
        return claim_run_dir(_run_dir_path(config), generated=True)
    return claim_run_dir(Path(run_dir), generated=False, fresh=not resuming)


def resolve_resume(resume: str | Path) -> tuple[Path, dict[str, Any], Path]:
    """Run directory, saved configuration and last checkpoint of a run to resume.

    ``resume`` is the run directory or its ``checkpoints/last.safetensors``.
    """
    path = Path(resume)
    run_dir = path.parent.parent if path.suffix == ".safetensors" else path
    checkpoint = path if path.suffix == ".safetensors" else run_dir / "checkpoints" / "last.safetensors"
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"cannot resume: no config.yaml in {run_dir}")
    if not checkpoint.is_file():
        raise FileNotFoundError(f"cannot resume: no checkpoint {checkpoint} (did the first epoch finish?)")
    return run_dir, load_config(config_path), checkpoint


def _stats_to_tensors(stats: Mapping[str, FeatureStats]) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {"mean": torch.from_numpy(s.mean), "std": torch.from_numpy(s.std)} for name, s in stats.items()}


def _stats_from_tensors(stored: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, FeatureStats]:
    return {name: FeatureStats(s["mean"].numpy(), s["std"].numpy()) for name, s in stored.items()}


def prefixed_metrics(results: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    values = results[0] if results else {}
    return {key[len(prefix) + 1 :]: float(value) for key, value in values.items() if key.startswith(prefix + "/")}


@contextlib.contextmanager
def _restore_torch_settings() -> Iterator[None]:
    """Undo the process-wide settings a run changes (CPU threads, deterministic algorithms)."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def train(
    config: Mapping[str, Any],
    *,
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Train, pick the best checkpoint on validation, test it once (see the module docstring).

    Args:
        config: a configuration (defaults are filled in).
        resume: a run directory (or its last checkpoint) to continue; its saved
            configuration is used, and of ``config`` only the display keys
            ``trainer.progress_bar`` and ``trainer.quiet``.
        run_dir: where to write (default: a new ``output_dir/name[_k]``).
        callbacks: extra Lightning callbacks.
    """
    with _restore_torch_settings():
        return _train(config, resume=resume, run_dir=run_dir, callbacks=callbacks)


def _train(
    config: Mapping[str, Any] | None,
    *,
    resume: str | Path | None,
    run_dir: str | Path | None,
    callbacks: Sequence[Callback],
) -> RunResult:
    resume_checkpoint = None
    if resume is not None:
        saved = config or {}
        run_dir, config, resume_checkpoint = resolve_resume(resume)
        # Only how the run is displayed may differ from the saved configuration.
        display = {k: v for k, v in saved.get("trainer", {}).items() if k in DISPLAY_KEYS}
        config = {**config, "trainer": {**config.get("trainer", {}), **display}}
        # The saved run keeps the version it recorded (none: an older run); the keys it saved
        # tell which defaults it relies on, and a changed weight layout is built as it was then.
        warn_default_changes(config, origin=f"{Path(run_dir) / 'config.yaml'}")
        config = defaults_then(config)
    config = resolve_config(config)
    if resume is None:  # a configuration file that states an older version; the run records this one
        name = config.get("name")
        warn_default_changes(config, origin=f"configuration {name!r}" if name else "the configuration", saved=False)
        config["polyfuse_version"] = __version__
    run_dir, lock = _claim(config, run_dir, resuming=resume is not None)
    try:
        return _train_in(config, run_dir, resume_checkpoint, callbacks)
    except BaseException as error:
        if isinstance(error, OSError):
            error.polyfuse_run_dir = run_dir  # type: ignore[attr-defined]  # the CLI says how to resume
        if lock is not None:
            lock.discard_if_unused()  # a run that wrote nothing leaves no empty run.lock behind
        raise
    finally:
        if lock is not None:
            lock.release()


def _check_resume_checkpoint(path: Path, task: FusionTask, config: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another model, or one with NaN weights or statistics."""
    checkpoint = read_checkpoint(path)
    extras = checkpoint.get("polyfuse")
    check_extras(extras, path)
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise ValueError(f"{path}: not a polyfuse training checkpoint (no state_dict)")
    if resolve_config(extras["config"])["model"] != config["model"]:
        raise ValueError(
            f"cannot resume from {path}: it was trained with another model configuration than "
            f"the run's config.yaml (model.fusion {extras['config'].get('model', {}).get('fusion')!r})"
        )
    expected = task.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        first = (missing or unexpected or wrong)[0]
        raise ValueError(
            f"cannot resume from {path}: its weights belong to another model "
            f"({len(missing)} missing, {len(unexpected)} unexpected, {len(wrong)} of another shape; "
            f"first: {first!r})"
        )
    check_finite_state(state, path)


def _run_parts(config: dict[str, Any]) -> tuple[Any, Any, dict[str, int], int]:
    """Data module, task (its checkpoint extras set), partition sizes and training steps
    per epoch of a run; ``task.type: vqa`` has its own (:mod:`polyfuse.engine.vqa_run`)."""
    if config["task"]["type"] == "vqa":
        from polyfuse.engine.vqa_run import vqa_run_parts

        return vqa_run_parts(config)
    data = build_data(config)
    if not len(data.partitions["valid"]):
        raise ValueError("the validation partition is empty")
    datamodule = FusionDataModule(
        data, batch_size=config["data"]["batch_size"], eval_batch_size=config["data"]["eval_batch_size"],
        seed=int(config["seed"]),
    )
    task = build_task(config, data.input_dims, data.modalities, data.label_info)
    task.checkpoint_extras = {
        "config": config,
        "modalities": data.modalities,
        "input_dims": data.input_dims,
        "label_info": data.label_info,
        "stats": _stats_to_tensors(data.stats),
    }
    samples = {key: len(p) for key, p in data.partitions.items()}
    return datamodule, task, samples, -(-len(data.partitions["train"]) // config["data"]["batch_size"])


def _train_in(
    config: dict[str, Any], run_dir: Path, resume_checkpoint: Path | None, callbacks: Sequence[Callback]
) -> RunResult:
    if not is_worker():  # the data of a resumed run must be the data it started on
        if resume_checkpoint is not None:
            check_data_hashes(run_dir)
        else:
            record_data_hashes(run_dir, data_files(config))
    if config["task"]["type"] == "captioning":  # its own data and task: engine/captioning_runs.py
        from polyfuse.engine.captioning_runs import train_captioning

        return train_captioning(config, run_dir, resume_checkpoint, callbacks)
    seed_everything(int(config["seed"]))
    datamodule, task, samples, steps = _run_parts(config)
    devices = int(config["trainer"]["devices"])
    if resume_checkpoint is not None:
        _check_resume_checkpoint(resume_checkpoint, task, config)
    trainer, checkpoint = build_trainer(config, run_dir, callbacks=callbacks, steps_per_epoch=steps)
    threads = thread_plan_for(config["trainer"])  # the CLI prints it; results.json records it
    if threads.oversubscribed and not is_worker():
        warnings.warn(threads.describe(), stacklevel=2)
    if not is_worker():
        atomic_write_text(run_dir / "config.yaml", dump_config(config))
        if devices > 1:
            os.environ[RUN_DIR_ENV] = str(run_dir)
    start = time.perf_counter()
    handler = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=str(resume_checkpoint) if resume_checkpoint else None)
    except SystemExit:
        # Lightning turns Ctrl-C into a graceful shutdown and sys.exit(1).
        if trainer.interrupted:
            raise RunInterrupted(run_dir) from None
        raise
    except ValueError as error:
        # The data were checked finite before training: NaN / Inf met inside the model
        # after some steps comes from the weights, i.e. the optimisation diverged.
        if trainer.global_step > 0 and re.search(r"contains (NaN|Inf)", str(error)):
            raise DivergenceError(divergence_message(int(trainer.global_step), "the activations")) from error
        raise
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT after a Ctrl-C
        if not is_worker():
            os.environ.pop(RUN_DIR_ENV, None)
    seconds = time.perf_counter() - start
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    if best is None or not best.is_file():
        raise RuntimeError(f"training produced no best checkpoint in {run_dir / 'checkpoints'}")
    validation = prefixed_metrics(trainer.validate(task, datamodule=datamodule, ckpt_path=str(best), verbose=False), "val")
    test: dict[str, float] = {}
    if samples.get("test"):
        test = prefixed_metrics(trainer.test(task, datamodule=datamodule, ckpt_path=str(best), verbose=False), "test")
    epochs = int(trainer.current_epoch)
    result = RunResult(run_dir, best, validation, test, epochs, seconds, config, checkpoint_epoch(best))
    if trainer.is_global_zero:
        monitor, mode = monitor_of(config)
        summary = {
            "best_checkpoint": os.path.relpath(best, run_dir),  # relative: the run may be moved
            "monitor": monitor,
            "mode": mode,
            "validation": validation,
            "test": test,
            "epochs": epochs,
            "best_epoch": result.best_epoch,
            "train_seconds": round(seconds, 3),
            "resumed": resume_checkpoint is not None,
            "samples": samples,
            "threads": threads.to_dict() | {"torch_intra_op": torch.get_num_threads(),
                                            "torch_inter_op": torch.get_num_interop_threads()},
        }
        atomic_write_text(run_dir / "results.json", json.dumps(summary, indent=2) + "\n")
        try:
            from polyfuse.engine.plots import plot_learning_curves

            plot_learning_curves(run_dir, run_dir / "learning_curves.png")
        except (ValueError, ImportError):  # pragma: no cover - no epochs logged or no matplotlib
            pass
    return result


def load_model(checkpoint: str | Path) -> tuple[FusionTask, dict[str, Any]]:
    """The task module of a checkpoint, weights loaded, in eval mode, and its stored extras."""
    state_dict, extras = load_state(checkpoint)
    config = resolve_config(extras["config"])
    warn_default_changes(config, origin=str(checkpoint))
    extras = {**extras, "config": config}
    if config["task"]["type"] == "vqa":
        from polyfuse.engine.vqa_run import load_vqa_model

        return load_vqa_model(state_dict, extras, checkpoint), extras
    task = build_task(config, extras["input_dims"], extras["modalities"], extras["label_info"])
    try:
        task.load_state_dict(state_dict)
    except RuntimeError as error:
        raise ValueError(f"{checkpoint}: the weights do not fit the stored configuration: {error}") from None
    task.eval()
    return task, extras


def data_for(
    extras: Mapping[str, Any],
    source: str | None,
    partitions: Sequence[str] | None,
    require_labels: bool,
    modalities: Sequence[str] | None = None,
) -> PreparedData:
    """The data a checkpoint is applied to.

    ``modalities``: the arrays of ``source`` that stand for the checkpoint's
    modalities, in its order (e.g. a checkpoint trained on ``synthetic:`` data
    applied to an npz file whose arrays have other names).
    """
    config = extras["config"]
    trained = list(extras["modalities"])
    if modalities is not None:
        modalities = [m.strip() for m in (modalities.split(",") if isinstance(modalities, str) else modalities) if m.strip()]
        if len(modalities) != len(trained):
            raise ValueError(
                f"--modalities names {len(modalities)} arrays {modalities}; the checkpoint was trained "
                f"on {len(trained)} modalities {trained}"
            )
        config = {**config, "data": {**config["data"], "modalities": modalities}}
    elif source is not None and config["data"]["modalities"] is None:
        config = {**config, "data": {**config["data"], "modalities": trained}}
    stats = _stats_from_tensors(extras["stats"])
    wanted = modalities or trained
    stats = {new: stats[old] for new, old in zip(wanted, trained, strict=True) if old in stats}
    data = build_data(
        config, source=source, stats=stats, label_info=extras["label_info"],
        partitions=partitions, require_labels=require_labels,
    )
    if data.modalities != list(wanted):
        raise ValueError(
            f"the data has modalities {data.modalities}, the checkpoint {trained}; "
            "name the arrays to use with --modalities"
        )
    if list(data.input_dims) != list(extras["input_dims"]):
        raise ValueError(
            f"the modalities {data.modalities} have feature sizes {data.input_dims}; the checkpoint "
            f"was trained on sizes {list(extras['input_dims'])}"
        )
    return data


def _captioning(checkpoint: str | Path, source: str | None, modalities: Sequence[str] | None) -> bool:
    """Whether a checkpoint is of task.type captioning (which reads its own feature files)."""
    from polyfuse.engine.captioning_runs import is_captioning_checkpoint

    if not is_captioning_checkpoint(checkpoint):
        return False
    if source is not None or modalities is not None:
        raise ValueError("a captioning checkpoint reads the feature files of its configuration: drop --data / --modalities")
    return True


def partition_key(data: PreparedData, split: str) -> str:
    if split not in data.partitions:
        raise ValueError(f"no {split!r} split; have {', '.join(data.partitions)}")
    if not len(data.partitions[split]):
        others = [key for key, rows in data.partitions.items() if len(rows)]
        raise ValueError(
            f"the {split!r} split of {data.origin} has no rows; "
            f"choose --split all or one of: {', '.join(others) or '(none)'}"
        )
    return split


def quiet_trainer(config: Mapping[str, Any]):
    config = {**config, "trainer": {**config["trainer"], "devices": 1, "strategy": "auto", "progress_bar": False}}
    trainer, _ = build_trainer(config, None, for_training=False)
    return trainer


def evaluate(
    checkpoint: str | Path, *, split: str = "test", source: str | None = None, modalities: Sequence[str] | None = None
) -> dict[str, float]:
    """Metrics of a checkpoint on one split (``train``, ``valid``, ``test``; ``all``
    for every row of a file without a split)."""
    if _captioning(checkpoint, source, modalities):
        from polyfuse.engine.captioning_runs import evaluate_captioning

        return evaluate_captioning(checkpoint, split=split)
    task, extras = load_model(checkpoint)
    if extras["config"]["task"]["type"] == "vqa":
        from polyfuse.engine.vqa_run import evaluate_vqa

        return evaluate_vqa(task, extras, split=split, source=source, modalities=modalities)
    partitions = ["all"] if split == "all" else None
    data = data_for(extras, source, partitions, require_labels=True, modalities=modalities)
    key = partition_key(data, split)
    datamodule = FusionDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    trainer = quiet_trainer(extras["config"])
    task.stage_metrics["test"].reset()
    results = trainer.test(task, dataloaders=datamodule.loader(key), verbose=False)
    return prefixed_metrics(results, "test")


def predict(
    checkpoint: str | Path,
    *,
    source: str | None = None,
    split: str = "all",
    out: str | Path | None = None,
    modalities: Sequence[str] | None = None,
    images: str | Path | None = None,
    top_k: int = 1,
) -> list[dict[str, Any]]:
    """Predictions of a checkpoint for the rows of a data source, optionally as a CSV.

    ``split``: ``all`` (every row, labels optional) or a partition name. Each
    record holds ``row``, ``id`` (when ``data.id`` names an array), the prediction
    (``prediction``; ``prediction_<target>`` for traits; ``prediction`` as the class
    value and ``prob_<class>`` for classification) and ``label`` when known.
    Captioning checkpoints: records ``id`` and ``caption``, written as JSON
    ``{video_id: caption}``. VQA checkpoints: ``source`` a questions file about the
    images of ``images``, and the ``top_k`` best answers of each question
    (:func:`polyfuse.engine.vqa_run.predict_vqa`).
    """
    if _captioning(checkpoint, source, modalities):
        if images is not None or top_k != 1:
            raise ValueError("--images and --top-k apply to a VQA checkpoint only")
        from polyfuse.engine.captioning_runs import predict_captioning

        captions = predict_captioning(checkpoint, split=split, out=out)
        return [{"id": video, "caption": caption} for video, caption in captions.items()]
    task, extras = load_model(checkpoint)
    if extras["config"]["task"]["type"] == "vqa":
        from polyfuse.engine.vqa_run import predict_vqa

        return predict_vqa(
            task, extras, split=split, out=out, source=source, modalities=modalities, images=images, top_k=top_k
        )
    if images is not None or top_k != 1:
        raise ValueError("--images and --top-k apply to a VQA checkpoint only")
    data = data_for(extras, source, ["all"] if split == "all" else None, require_labels=False, modalities=modalities)
    key = partition_key(data, split)
    datamodule = FusionDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    trainer = quiet_trainer(extras["config"])
    outputs = trainer.predict(task, dataloaders=datamodule.loader(key))
    rows = torch.cat([o["row"] for o in outputs]).numpy()
    predictions = torch.cat([o["prediction"] for o in outputs]).numpy()
    records = _records(extras, data, rows, predictions)
    if out is not None:
        _write_csv(records, Path(out))
    return records


def _records(extras: Mapping[str, Any], data: PreparedData, rows: np.ndarray, predictions: np.ndarray) -> list[dict[str, Any]]:
    task_type = extras["config"]["task"]["type"]
    info = extras["label_info"]
    records = []
    for i, row in enumerate(rows.tolist()):
        record: dict[str, Any] = {"row": row}
        if data.ids is not None:
            record["id"] = data.ids[row].item()
        if task_type == "sentiment":
            record["prediction"] = float(predictions[i])
            if data.targets is not None:
                record["label"] = float(data.targets[row])
        elif task_type == "traits":
            for j, name in enumerate(info["names"]):
                record[f"prediction_{name}"] = float(predictions[i, j])
            if data.targets is not None:
                for j, name in enumerate(info["names"]):
                    record[f"label_{name}"] = float(data.targets[row, j])
        else:
            classes = info["classes"]
            record["prediction"] = classes[int(predictions[i].argmax())]
            for c, value in enumerate(classes):
                record[f"prob_{value}"] = float(predictions[i, c])
            if data.targets is not None and data.targets[row] >= 0:
                record["label"] = classes[int(data.targets[row])]
        records.append(record)
    return records


def _write_csv(records: Sequence[Mapping[str, Any]], path: Path) -> None:
    fields = list(records[0]) if records else ["row"]
    with atomic_temp_path(path) as temp, temp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
