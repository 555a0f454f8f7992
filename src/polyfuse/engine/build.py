"""Build data, model, task and trainer from a resolved configuration."""

from __future__ import annotations

import inspect
import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger

import polyfuse.nn
from polyfuse.data import FeatureStats, PreparedData, load_source, prepare_data
from polyfuse.data.sources import is_synthetic, synthetic_modalities
from polyfuse.engine.backbones import build_named_backbone
from polyfuse.engine.checkpoints import SafetensorsCheckpointIO, SafetensorsModelCheckpoint
from polyfuse.engine.divergence import DivergenceGuard
from polyfuse.engine.logs import AtomicCSVLogger
from polyfuse.engine.seeding import ReseedEachEpoch
from polyfuse.engine.threads import apply_thread_plan, thread_plan_for
from polyfuse.tasks import FusionBackbone, FusionTask, ModalityEncoder, task_class

__all__ = [
    "build_backbone",
    "build_data",
    "build_task",
    "build_trainer",
    "fusion_options",
    "monitor_of",
    "quiet_lightning",
]


def quiet_lightning() -> None:
    """Silence Lightning's info lines and the warnings that do not apply here."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _filter_warnings() -> None:
    # In-memory tensors: worker processes would only add start-up time.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*number of training batches.*logging interval.*")
    # Lightning 2.6's own use of a torch API that newer torch deprecates.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    # Resuming writes into the run's own checkpoint directory on purpose.
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")


def build_data(
    config: Mapping[str, Any],
    *,
    source: str | None = None,
    stats: Mapping[str, FeatureStats] | None = None,
    label_info: Mapping[str, Any] | None = None,
    partitions: Sequence[str] | None = None,
    require_labels: bool = True,
    base: str | Path | None = None,
) -> PreparedData:
    """Load the data source (``source`` overrides ``data.source``) and prepare it."""
    data = dict(config["data"])
    data["source"] = source or data["source"]
    table = load_source(
        data["source"], base=base, padding=data.get("padding", "auto"), modalities=data.get("modalities") or None
    )
    if not data.get("modalities") and is_synthetic(data["source"]):
        data["modalities"] = synthetic_modalities(data["source"])
        if data.get("split") is None:
            data["split"] = "split"
    if table.modalities:  # a word-aligned directory: the modalities it holds, its own split
        data["modalities"] = data.get("modalities") or list(table.modalities)
        if data.get("split") is None:
            data["split"] = "split"
    return prepare_data(
        table, data, config["task"], stats=stats, label_info=label_info,
        partitions=partitions, require_labels=require_labels,
    )


def _groups(config: Mapping[str, Any], names: Sequence[str]) -> list[list[int]] | None:
    fusion = config["model"]["fusion"]
    spec = config["model"]["input_groups"].get(fusion)
    if not spec:
        return None
    groups = []
    for group in spec:
        group = [group] if isinstance(group, str) else list(group)
        for name in group:
            if name not in names:
                raise ValueError(
                    f"model.input_groups.{fusion} names {name!r}, not one of the modalities {list(names)}"
                )
        groups.append([list(names).index(name) for name in group])
    return groups


def _input_indices(
    values: Sequence[str | int], names: Sequence[str], groups: list[list[int]] | None, option: str
) -> list[int]:
    """Fusion input indices for modality names (indices pass through), e.g. TFN's and
    LMF's ``sequence_modalities: [text]``; with input groups, the group holding the name."""
    inputs = groups or [[j] for j in range(len(names))]
    indices = []
    for value in values:
        if isinstance(value, int):
            indices.append(value)
            continue
        if value not in names:
            raise ValueError(f"{option} names {value!r}, not one of the modalities {list(names)}")
        indices.append(next(i for i, group in enumerate(inputs) if list(names).index(value) in group))
    return indices


def fusion_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options of ``model.fusion``'s class from ``model.options.<name>`` of a
    resolved configuration, checked against its signature (an unknown option is an error
    listing those it takes), with ``seed`` added for a fusion that takes one."""
    name = config["model"]["fusion"]
    cls = polyfuse.nn.get(name)  # an unknown name lists the known ones
    options = dict(config["model"]["options"].get(name) or {})
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(key for key in options if key not in accepted or key in ("self", "input_dims", "out_dim"))
    if unknown and not takes_any:
        valid = [key for key in accepted if key not in ("self", "input_dims", "out_dim")]
        raise ValueError(f"model.options.{name}: unknown option(s) {unknown}; {cls.__name__} takes: {', '.join(valid)}")
    if "seed" in accepted and "seed" not in options:
        options["seed"] = int(config["seed"])  # e.g. MAN's random features
    return options


def _with_config_keys(message: str, fusion: str, cls: type) -> str:
    """``message`` with the config keys of the constructor arguments it names, for CLI users
    (TFN's size guard names ``max_fused_size``; a config sets ``model.options.tfn.max_fused_size``)."""
    named = [
        name for name in inspect.signature(cls.__init__).parameters
        if name not in ("self", "input_dims", "out_dim") and re.search(rf"\b{re.escape(name)}\b", message)
    ]
    if not named:
        return message
    keys = ", ".join(f"model.options.{fusion}.{name}" for name in named)
    return f"{message} [in a configuration: {keys}]"


def build_backbone(config: Mapping[str, Any], input_dims: Sequence[int], names: Sequence[str]) -> torch.nn.Module:
    """Encoders, the fusion module named by ``model.fusion`` and the projection; or,
    with ``model.backbone`` other than ``fusion``, that backbone with the fusion
    module as its extra module (see :mod:`polyfuse.engine.backbones`)."""
    model = config["model"]
    if model.get("backbone", "fusion") != "fusion":
        return build_named_backbone(config, input_dims, names, fusion_options)
    encoder = model["encoder"]
    marker = bool(model["centre_marker"])  # one more input channel per modality
    encoders = [
        ModalityEncoder(d + marker, kind=encoder.get("type", "linear"), hidden_dim=int(encoder.get("hidden_dim", 64)),
                        dropout=float(encoder.get("dropout", 0.0)))
        for d in input_dims
    ]
    groups = _groups(config, names)
    group_dims = [sum(encoders[j].output_dim for j in g) for g in groups] if groups else [e.output_dim for e in encoders]
    options = fusion_options(config)
    if options.get("sequence_modalities") is not None:  # TFN, LMF: names of the LSTM-read modalities
        options["sequence_modalities"] = _input_indices(
            options["sequence_modalities"], names, groups, f"model.options.{model['fusion']}.sequence_modalities"
        )
    cls = polyfuse.nn.get(model["fusion"])
    limit = getattr(cls, "max_modalities", None)
    if limit is not None and len(group_dims) > limit:
        raise ValueError(
            f"{cls.__name__} takes at most {limit} inputs but the data has {len(group_dims)} modalities "
            f"{list(names)}; set model.input_groups.{model['fusion']} (e.g. [[{names[0]}], "
            f"[{', '.join(names[1:])}]]) to group them"
        )
    try:
        fusion = polyfuse.nn.create(model["fusion"], input_dims=group_dims, out_dim=int(model["fusion_dim"]), **options)
    except TypeError as error:
        raise ValueError(f"model.options.{model['fusion']}: {error}") from None
    except ValueError as error:
        raise ValueError(_with_config_keys(str(error), model["fusion"], cls)) from None
    return FusionBackbone(
        fusion, encoders, fusion_dim=int(model["fusion_dim"]), out_dim=int(model["out_dim"]), groups=groups,
        skip=bool(model["skip"]), centre_marker=marker, dropout=float(model["dropout"]), modality_names=names,
    )


def build_task(
    config: Mapping[str, Any], input_dims: Sequence[int], names: Sequence[str], label_info: Mapping[str, Any]
) -> FusionTask:
    """The task module of ``task.type`` around a new backbone."""
    task = config["task"]
    options: dict[str, Any] = {
        "lr": config["optim"]["lr"],
        "weight_decay": config["optim"]["weight_decay"],
        "scheduler": config["optim"]["scheduler"],
        "optimizer": config["optim"]["optimizer"],
        "max_epochs": config["trainer"]["max_epochs"],
    }
    cls = task_class(task["type"])
    if task["type"] in ("sentiment", "traits"):
        options["loss"] = task["loss"]
    if task["type"] == "traits":
        options.update(names=label_info["names"], ranges=label_info["ranges"])
    if task["type"] == "classification":
        options.update(num_classes=len(label_info["classes"]), label_smoothing=float(task["label_smoothing"]))
    return cls(build_backbone(config, input_dims, names), **options)


def monitor_of(config: Mapping[str, Any]) -> tuple[str, str]:
    """The validation metric that picks the best checkpoint and stops early, and its mode."""
    default_key, default_mode = task_class(config["task"]["type"]).default_monitor
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
    if trainer_config["quiet"]:
        quiet_lightning()
    _filter_warnings()
    apply_thread_plan(thread_plan_for(trainer_config))  # never more threads than free cores by default
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
