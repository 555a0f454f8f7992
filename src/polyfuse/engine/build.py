"""The Lightning trainer of a resolved configuration, and the validation metric it monitors."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger

from polyfuse.engine.checkpoints import SafetensorsCheckpointIO, SafetensorsModelCheckpoint
from polyfuse.engine.divergence import DivergenceGuard
from polyfuse.engine.logs import AtomicCSVLogger
from polyfuse.engine.seeding import ReseedEachEpoch
from polyfuse.engine.threads import apply_thread_plan, thread_plan_for
from polyfuse.tasks.registry import task_spec

__all__ = [
    "build_trainer",
    "monitor_of",
    "quiet_lightning",
]


def quiet_lightning() -> None:
    """Silence Lightning's info lines (GPU / TPU available, fit stopped, ...); its warnings stay."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


# Lightning's info lines that never say anything about the run: an advertisement, and the
# loading of the best checkpoint by train's final validation and test (train names that
# checkpoint itself). A resumed run still says "Restored all states from the checkpoint at ...".
_NOISE = (
    "💡 Tip:",
    "Restoring states from the checkpoint path at ",
    "Loaded model weights from the checkpoint at ",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NOISE)


def _drop_lightning_noise() -> None:
    # the loggers of Lightning's rank_zero_info, where these records are made
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())


def _filter_warnings() -> None:
    # In-memory tensors: worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*number of training batches.*logging interval.*")
    # Lightning 2.6's own use of a torch API that newer torch deprecates.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    # Resuming writes into the run's own checkpoint directory on purpose.
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")


def monitor_of(config: Mapping[str, Any]) -> tuple[str, str]:
    """The validation metric that picks the best checkpoint and stops early, and its mode."""
    default_key, default_mode = task_spec(config["task"]["type"]).default_monitor
    key = config["trainer"]["monitor"] or default_key
    if not key.startswith("val/"):
        raise ValueError(f"trainer.monitor must be a validation metric (val/...), got {key!r}")
    mode = config["trainer"]["mode"] or (default_mode if key == default_key else ("min" if "loss" in key or "mae" in key else "max"))
    return key, mode


def build_trainer(
    config: Mapping[str, Any],
    run_dir: Path | None,
    *,
    callbacks: Sequence[Callback] = (),
    steps_per_epoch: int | None = None,
    for_training: bool = True,
) -> tuple[L.Trainer, SafetensorsModelCheckpoint | None]:
    """A Lightning trainer: checkpoints (best on validation and last), early stopping,
    CSV and TensorBoard logs under ``run_dir``, seeded epochs, DDP and precision options."""
    trainer_config = config["trainer"]
    if trainer_config["quiet"] or not for_training:  # evaluation and prediction print results only
        quiet_lightning()
    _drop_lightning_noise()
    _filter_warnings()
    apply_thread_plan(thread_plan_for(config))  # never more threads than free cores by default
    all_callbacks: list[Callback] = [ReseedEachEpoch(int(config["seed"]))]
    if for_training:
        all_callbacks.append(DivergenceGuard())
    checkpoint = None
    loggers: list[Any] | bool = False
    if for_training:
        monitor, mode = monitor_of(config)
        checkpoint = SafetensorsModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="best", monitor=monitor, mode=mode,
            save_top_k=1, auto_insert_metric_name=False, enable_version_counter=False,
        )
        # Lightning's save_last only writes when a best checkpoint is written; resuming
        # needs the state at the end of every epoch. Checkpoint callbacks run after the
        # others, and this one after the best one, so it holds their updated state.
        last = SafetensorsModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="last", monitor=None,
            save_top_k=1, enable_version_counter=False,
        )
        all_callbacks.extend([checkpoint, last])
        if trainer_config["patience"]:
            all_callbacks.append(EarlyStopping(monitor=monitor, mode=mode, patience=int(trainer_config["patience"])))
        loggers = [
            AtomicCSVLogger(str(run_dir), name="csv"),
            TensorBoardLogger(str(run_dir), name="tensorboard", default_hp_metric=False),
        ]
    if trainer_config["progress_bar"]:
        all_callbacks.append(TQDMProgressBar())
    all_callbacks.extend(callbacks)
    log_every = int(trainer_config["log_every_n_steps"])
    if steps_per_epoch:
        log_every = max(1, min(log_every, steps_per_epoch))
    trainer = L.Trainer(
        accelerator=trainer_config["accelerator"],
        devices=trainer_config["devices"],
        num_nodes=trainer_config["num_nodes"] if for_training else 1,  # evaluation and prediction: one process
        strategy=trainer_config["strategy"],
        precision=trainer_config["precision"],
        max_epochs=trainer_config["max_epochs"],
        min_epochs=trainer_config["min_epochs"],
        gradient_clip_val=trainer_config["gradient_clip_val"],
        deterministic=trainer_config["deterministic"],
        callbacks=all_callbacks,
        logger=loggers,
        enable_checkpointing=for_training,
        enable_progress_bar=bool(trainer_config["progress_bar"]),
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=log_every,
        use_distributed_sampler=False,  # FusionDataModule shards its own batches
        plugins=[SafetensorsCheckpointIO()],
        default_root_dir=str(run_dir) if run_dir else None,
    )
    return trainer, checkpoint
