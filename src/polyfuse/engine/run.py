"""Training, evaluation and prediction runs.

``train(config)`` writes, under the run directory::

    config.yaml            the resolved configuration, before training starts
    data_hashes.json       the sha256 of every data file the run reads; ``--resume``
                           refuses data that changed since (exit 2, naming the file)
    checkpoints/best.safetensors   best on the validation monitor: weights and extras
                                   (evaluate, predict, plot)
    checkpoints/last.safetensors   end of the last finished epoch, with the optimiser,
                                   scheduler and loop state (for --resume)
    csv/version_*/metrics.csv      per-epoch logs (a new version per resumed part)
    tensorboard/version_*/         the same for TensorBoard
    results.json           validation and test metrics of the best checkpoint, times
    learning_curves.png

The test split is evaluated once, after training, with the best checkpoint.
"""

from __future__ import annotations

import contextlib
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

import torch
from lightning.pytorch.callbacks import Callback

from polyfuse import __version__
from polyfuse.engine.build import build_trainer, monitor_of
from polyfuse.engine.checkpoints import (
    CheckpointExtras,
    check_extras,
    check_finite_state,
    check_resumable,
    checkpoint_epoch,
    load_state,
    read_checkpoint,
)
from polyfuse.engine.config import (
    check_written_by,
    data_files,
    dump_config,
    load_config,
    resolve_config,
)
from polyfuse.engine.divergence import divergence_message
from polyfuse.engine.errors import (
    DivergenceError,
    LoaderWorkerDied,
    RunInterrupted,
    original_message,
)
from polyfuse.engine.rundir import (
    RunDirLock,
    atomic_write_text,
    check_data_hashes,
    claim_run_dir,
    record_bad_input,
    record_data_hashes,
    safe_run_name,
)
from polyfuse.engine.seeding import seed_everything
from polyfuse.engine.threads import thread_plan_for
from polyfuse.tasks.registry import TaskData, TaskSpec, task_spec

__all__ = [
    "AppliedCheckpoint",
    "DryRun",
    "RunInterrupted",
    "RunResult",
    "apply_checkpoint",
    "dry_run",
    "evaluate",
    "evaluate_applied",
    "is_worker",
    "load_model",
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


def _launcher() -> tuple[int, int]:
    """(global rank, number of processes) given by torchrun or SLURM's srun, which start
    every process of a run themselves (as Lightning detects them); (0, 1) without them."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return int(os.environ.get("SLURM_PROCID", "0")), int(os.environ["SLURM_NTASKS"])
    return 0, 1


def is_worker() -> bool:
    """True in a DDP process other than the first: one Lightning started (it re-runs the
    command), or one of global rank > 0 that torchrun or srun started."""
    lightning = int(os.environ.get("LOCAL_RANK", "0")) > 0 or int(os.environ.get("NODE_RANK", "0")) > 0
    return lightning or _launcher()[0] > 0


def _run_dir_path(config: Mapping[str, Any]) -> Path:
    """``output_dir/name``; the name can never point outside ``output_dir``."""
    name = safe_run_name(str(config["name"] or config["model"]["fusion"]))
    return Path(str(config["output_dir"])) / name


def _claim(config: Mapping[str, Any], run_dir: str | Path | None, resuming: bool) -> tuple[Path, RunDirLock | None]:
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited and is_worker():
        return Path(inherited), None
    if _launcher()[1] > 1:  # torchrun or srun started every process: the first claims the directory
        if run_dir is None:
            raise ValueError("the processes started by torchrun or srun must share one run directory: give it "
                             "with --out DIR (the same on every machine)")
        if is_worker():
            return Path(run_dir), None
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
    check_resumable(checkpoint)  # refuses one an older polyfuse wrote
    return run_dir, load_config(config_path, saved=True), checkpoint


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


@dataclass(frozen=True)
class DryRun:
    """What :func:`dry_run` built: the rows per split, the model's parameters, the optimiser
    and schedule that training would use."""

    task: str
    samples: dict[str, int]
    parameters: int
    optimizer: str
    scheduler: str | None

    def describe(self) -> str:
        splits = ", ".join(f"{split} {rows}" for split, rows in self.samples.items())
        schedule = f", schedule {self.scheduler}" if self.scheduler else ""
        return (f"task {self.task}: {splits} rows; {self.parameters:,} trainable parameters; "
                f"optimiser {self.optimizer}{schedule}")


def dry_run(config: Mapping[str, Any]) -> DryRun:
    """Build what :func:`train` builds before its first step (the data readers over the
    configured files, with every check they make, the model, its optimiser and schedule)
    and train nothing: a configuration and its data, checked in seconds."""
    with _restore_torch_settings():
        config = resolve_config(config)
        spec = task_spec(config["task"]["type"])
        seed_everything(int(config["seed"]))
        data = spec.build_data(config)
        task = spec.build_module(config, data)
        configured = task.configure_optimizers()
        optimizer, scheduler = configured, None
        if isinstance(configured, Mapping):
            optimizer = configured["optimizer"]
            scheduler = configured.get("lr_scheduler", {}).get("scheduler")
        parameters = sum(p.numel() for p in task.parameters() if p.requires_grad)
        return DryRun(config["task"]["type"], dict(data.samples), parameters, type(optimizer).__name__,
                      None if scheduler is None else type(scheduler).__name__)


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
    elif config is not None:  # one that states an older version is refused; the run records this one
        name = config.get("name")
        check_written_by(config, f"configuration {name!r}" if name else "the configuration", saved=False)
    config = resolve_config(config)
    if resume is None:
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


def _check_resume_checkpoint(path: Path, task: Any, config: Mapping[str, Any], spec: TaskSpec) -> None:
    """Refuse a checkpoint of another model, or one with NaN weights or statistics."""
    checkpoint = read_checkpoint(path)
    extras = checkpoint.get("polyfuse")
    check_extras(extras, path)
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise ValueError(f"{path}: not a polyfuse training checkpoint (no state_dict)")
    saved = resolve_config(extras["config"])
    for section in spec.model_sections:
        if saved.get(section) != config.get(section):
            fusion = f" (model.fusion {extras['config'].get('model', {}).get('fusion')!r})" if section == "model" else ""
            raise ValueError(
                f"cannot resume from {path}: it was trained with another {section} configuration than "
                f"the run's config.yaml{fusion}"
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


def _train_in(
    config: dict[str, Any], run_dir: Path, resume_checkpoint: Path | None, callbacks: Sequence[Callback]
) -> RunResult:
    spec = task_spec(config["task"]["type"])
    if not is_worker():  # the data of a resumed run must be the data it started on
        if resume_checkpoint is not None:
            for note in check_data_hashes(run_dir):
                print(note)
        else:
            record_data_hashes(run_dir, data_files(config))
    seed_everything(int(config["seed"]))
    data = spec.build_data(config)
    task = spec.build_module(config, data)
    extras = spec.checkpoint_extras(config, data)
    datamodule, samples = data.datamodule, data.samples
    if resume_checkpoint is not None:
        _check_resume_checkpoint(resume_checkpoint, task, config, spec)
    prepared = spec.prepare_module(task, config, data, resume_checkpoint is not None)
    trainer, checkpoint = build_trainer(
        config, run_dir, callbacks=[CheckpointExtras(extras), *callbacks], steps_per_epoch=data.steps_per_epoch
    )
    threads = thread_plan_for(config)  # the CLI prints it; results.json records it
    if threads.oversubscribed and not is_worker():
        warnings.warn(threads.describe(), stacklevel=2)
    if not is_worker():
        atomic_write_text(run_dir / "config.yaml", dump_config(config))
        if int(config["trainer"]["devices"]) > 1:  # the processes Lightning starts re-run the command
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
        # Bad input is refused where it is read, naming the file: NaN / Inf met inside
        # the model after some steps comes from the weights, i.e. the optimisation diverged.
        if isinstance(error, DivergenceError):
            raise
        if trainer.global_step > 0 and re.search(r"contains (NaN|Inf)", str(error)):
            raise DivergenceError(divergence_message(int(trainer.global_step), "the activations")) from error
        message = original_message(error)  # as a loader worker raised it
        if not is_worker():
            record_bad_input(run_dir, message)  # --resume accepts the file repaired
        raise ValueError(message) from None
    except RuntimeError as error:
        if "DataLoader worker" in str(error):
            raise LoaderWorkerDied(run_dir, str(error)) from error
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
        added = spec.after_test(task, data, run_dir) if samples.get("test") else {}
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
            **prepared,
            **added,
        }
        atomic_write_text(run_dir / "results.json", json.dumps(summary, indent=2) + "\n")
        try:
            from polyfuse.engine.learning_curves import plot_learning_curves

            plot_learning_curves(run_dir, run_dir / "learning_curves.png")
        except (ValueError, ImportError):  # pragma: no cover - no epochs logged or no matplotlib
            pass
    return result


def load_model(checkpoint: str | Path) -> tuple[Any, dict[str, Any]]:
    """The task module of a checkpoint, weights loaded, in eval mode, and its stored extras
    (the configuration resolved). One an older polyfuse wrote is refused (:func:`load_state`)."""
    state_dict, extras = load_state(checkpoint)
    config = resolve_config(extras["config"])
    extras = {**extras, "config": config}
    return task_spec(config["task"]["type"]).load_module(state_dict, extras, checkpoint), extras


def quiet_trainer(config: Mapping[str, Any]):
    """A trainer for evaluation and prediction: one process, no progress bar, no logs."""
    config = {**config, "trainer": {**config["trainer"], "devices": 1, "strategy": "auto", "progress_bar": False}}
    trainer, _ = build_trainer(config, None, for_training=False)
    return trainer


@dataclass
class AppliedCheckpoint:
    """A checkpoint's module (eval mode) and extras, with the data of a split it is applied to."""

    spec: TaskSpec
    module: Any
    extras: dict[str, Any]
    data: TaskData
    split: str

    def loaders(self) -> dict[str, Any]:
        """The evaluation loaders of the split, by split."""
        return self.spec.loaders(self.data, self.split)


def apply_checkpoint(
    checkpoint: str | Path, *, split: str = "test", source: str | None = None,
    modalities: Sequence[str] | None = None, require_labels: bool = True, evaluating: bool = False, **options: Any,
) -> AppliedCheckpoint:
    """Load a checkpoint and the data of ``split`` it is applied to (``source`` and
    ``modalities`` as ``--data`` / ``--modalities``; ``options`` the task's own options
    of prediction, or of evaluation when ``evaluating``), as :func:`evaluate` and
    :func:`predict` do."""
    module, extras = load_model(checkpoint)
    spec = task_spec(extras["config"]["task"]["type"])
    accepted = spec.evaluate_options if evaluating else spec.predict_options
    unknown = [name for name, value in options.items() if name not in accepted and value is not None]
    if unknown:
        flags = " and ".join("--" + name.replace("_", "-") for name in unknown)
        raise ValueError(f"{flags} do(es) not apply to a {spec.name} checkpoint")
    if spec.reads_own_files and (source is not None or modalities is not None):
        raise ValueError(
            f"a {spec.name} checkpoint reads the files of its configuration: drop --data / --modalities"
        )
    chosen = {name: options.get(name) if options.get(name) is not None else default
              for name, default in accepted.items()}
    data = spec.checkpoint_data(
        extras, split=split, source=source, modalities=modalities, require_labels=require_labels, **chosen
    )
    spec.bind(module, data, **chosen)
    return AppliedCheckpoint(spec, module, extras, data, split)


def evaluate(
    checkpoint: str | Path, *, split: str = "test", source: str | None = None, modalities: Sequence[str] | None = None,
    **options: Any,
) -> dict[str, float]:
    """Metrics of a checkpoint on one split (``train``, ``val``, ``test``; ``all``
    for every row of a file without a split); ``options`` the task's own evaluation
    options (:attr:`~polyfuse.tasks.registry.TaskSpec.evaluate_options`: retrieval's and
    Chimera's ``shuffle_words``)."""
    return evaluate_applied(apply_checkpoint(checkpoint, split=split, source=source, modalities=modalities,
                                             evaluating=True, **options))


def evaluate_applied(applied: AppliedCheckpoint) -> dict[str, float]:
    """Metrics of an applied checkpoint's module, as it is now, on its split (a bench
    may change the loaded module, e.g. MAN's attention mode, between calls)."""
    (loader,) = applied.loaders().values()
    applied.spec.bind(applied.module, applied.data)
    results = quiet_trainer(applied.extras["config"]).test(applied.module, dataloaders=loader, verbose=False)
    return prefixed_metrics(results, "test")


def predict(
    checkpoint: str | Path,
    *,
    source: str | None = None,
    split: str = "all",
    out: str | Path | None = None,
    modalities: Sequence[str] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Predictions of a checkpoint for the rows of ``split`` (``all``: every row, labels
    optional) of its data or of ``source``, optionally written to ``out``.

    The records are the task's (:meth:`~polyfuse.tasks.registry.TaskSpec.records`):
    sentiment, traits and classification give ``row``, ``id`` (when ``data.id`` names an
    array), the prediction (``prediction``; ``prediction_<target>`` for traits;
    ``prediction`` as the class value and ``prob_<class>`` for classification) and
    ``label`` when known, as CSV; captioning ``id`` and ``caption``, as JSON
    ``{video_id: caption}``; VQA the answers of each question, as CSV, and takes the
    options ``images`` (new questions about new images, ``source`` their questions file)
    and ``top_k``.
    """
    applied = apply_checkpoint(checkpoint, split=split, source=source, modalities=modalities, require_labels=False,
                               **options)
    trainer = quiet_trainer(applied.extras["config"])
    with torch.no_grad():
        outputs = {key: trainer.predict(applied.module, dataloaders=loader) or []
                   for key, loader in applied.loaders().items()}
    records = applied.spec.records(applied.module, outputs, applied.data, applied.extras)
    if out is not None:
        applied.spec.write_records(records, Path(out))
    return records
