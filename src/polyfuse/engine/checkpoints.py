"""Checkpoints as safetensors files: no pickle is ever written or read.

A Lightning checkpoint is a nested dict (weights, optimiser state, loop and
callback state, ...). :func:`write_checkpoint` stores every tensor in it as a
safetensors tensor named by its path in the dict (``state_dict/backbone.head.weight``)
and everything else as JSON in the file's metadata, with markers for what JSON
lacks (tuples, non-string keys, tensors). :func:`read_checkpoint` rebuilds the
dict. Only plain data can be stored: anything else is refused with its path.

:class:`SafetensorsCheckpointIO` makes Lightning save and load (``--resume``,
best-on-validation) through these functions; :class:`SafetensorsModelCheckpoint`
names the files ``*.safetensors``. The checkpoint kept for its validation score
(``best``) is for using the model: it holds the weights, the run's extras and the epoch,
not the optimiser, scheduler and callback state that only resuming reads (that is in
``last``): Adam's two moments per weight would triple its size.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from weakref import proxy

import numpy as np
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from polyfuse.engine.config import check_written_by
from polyfuse.engine.rundir import atomic_temp_path

__all__ = [
    "CHECKPOINT_FORMAT",
    "RESUME_ONLY_KEYS",
    "CheckpointExtras",
    "SafetensorsCheckpointIO",
    "SafetensorsModelCheckpoint",
    "check_extras",
    "check_finite_state",
    "check_resumable",
    "check_version",
    "checkpoint_epoch",
    "decode",
    "encode",
    "load_state",
    "read_checkpoint",
    "write_checkpoint",
]

CHECKPOINT_FORMAT = "polyfuse-checkpoint/1"
#: what a Lightning checkpoint holds for resuming a run only (with the precision
#: plugin's state, under its class name): not in a weights-only checkpoint
RESUME_ONLY_KEYS = ("optimizer_states", "lr_schedulers", "callbacks")
_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__items__"


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def encode(value: Any, path: str, tensors: dict[str, Tensor]) -> Any:
    """A JSON-able copy of ``value`` whose tensors are moved into ``tensors`` by path."""
    if isinstance(value, Tensor):
        name, copy = path, 1
        while name in tensors:  # paths of keys holding "/" could meet
            name, copy = f"{path}#{copy}", copy + 1
        tensors[name] = value.detach().cpu().contiguous().clone()
        return {_TENSOR: name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {_TUPLE: [encode(v, _join(path, i), tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, _join(path, i), tensors) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(key, str) and not key.startswith("__") for key in value):
            return {key: encode(v, _join(path, key), tensors) for key, v in value.items()}
        items = []
        for key, v in value.items():
            if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
                raise TypeError(f"cannot store the key {key!r} (a {type(key).__name__}) at {path!r}")
            items.append([encode(key, _join(path, "key"), {}), encode(v, _join(path, key), tensors)])
        return {_ITEMS: items}
    raise TypeError(
        f"cannot store a {type(value).__name__} at {path!r} in a safetensors checkpoint "
        "(only tensors, numbers, strings, None, lists, tuples and dicts)"
    )


def decode(value: Any, tensors: Mapping[str, Tensor]) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        if set(value) == {_TUPLE}:
            return tuple(decode(v, tensors) for v in value[_TUPLE])
        if set(value) == {_ITEMS}:
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value[_ITEMS]}
        return {key: decode(v, tensors) for key, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def write_checkpoint(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Write a checkpoint dict to ``path`` (atomically: a partial file never replaces a good one)."""
    path = Path(path)
    tensors: dict[str, Tensor] = {}
    content = encode(dict(checkpoint), "", tensors)
    metadata = {"format": CHECKPOINT_FORMAT, "content": json.dumps(content)}
    # A unique temporary name: two writers never share a partial file.
    with atomic_temp_path(path) as partial:
        try:
            save_file(tensors, str(partial), metadata=metadata)
        except SafetensorError as error:  # e.g. the disk filled up while writing
            raise OSError(_os_error_number(str(error)), f"could not write the checkpoint ({error})", str(path)) from None


def _os_error_number(message: str) -> int:
    """The errno in a safetensors message ("... No space left on device (os error 28)"), else EIO."""
    found = re.search(r"\(os error (\d+)\)", message)
    return int(found.group(1)) if found else errno.EIO


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`write_checkpoint` (never unpickles anything)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix != ".safetensors":
        raise ValueError(
            f"{path}: polyfuse checkpoints are .safetensors files; other formats (pickled "
            ".ckpt / .pt files) are never loaded, as unpickling can run arbitrary code"
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(
                    f"{path}: not a polyfuse checkpoint (format {metadata.get('format')!r}, "
                    f"expected {CHECKPOINT_FORMAT!r})"
                )
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        content = json.loads(metadata["content"])
    except (SafetensorError, OSError, json.JSONDecodeError, KeyError) as error:
        raise ValueError(f"{path}: cannot read the checkpoint (corrupt or truncated?): {error}") from None
    try:
        return decode(content, tensors)
    except KeyError as error:
        raise ValueError(f"{path}: the checkpoint refers to a missing tensor {error}") from None


def checkpoint_epoch(path: str | Path) -> int | None:
    """The epoch (counted from 1) after which a training checkpoint was saved, read from
    its metadata alone (Lightning stores the 0-based ``epoch``); None if it has none."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            epoch = json.loads((handle.metadata() or {}).get("content", "{}")).get("epoch")
    except (SafetensorError, OSError, json.JSONDecodeError, AttributeError):
        return None
    return int(epoch) + 1 if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def check_resumable(path: str | Path) -> None:
    """Refuse to resume from a checkpoint without the optimiser's state (a ``best`` one,
    weights only), naming the one to give, or from one an older polyfuse wrote
    (:func:`check_version`); read from the file's metadata alone."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            content = json.loads((handle.metadata() or {}).get("content", "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read the checkpoint (corrupt or truncated?): {error}") from None
    if isinstance(content, dict) and "state_dict" in content and "optimizer_states" not in content:
        raise ValueError(
            f"{path} holds the weights only (a best checkpoint, for evaluate and predict): resume from the "
            "run directory or its checkpoints/last.safetensors"
        )
    extras = content.get("polyfuse") if isinstance(content, dict) else None
    if isinstance(extras, Mapping):
        check_version(extras, path)


class CheckpointExtras(Callback):
    """Writes a run's checkpoint extras (its task spec's ``checkpoint_extras``: the
    resolved configuration, vocabularies, statistics) into every checkpoint under
    ``"polyfuse"``, whatever the task's Lightning module."""

    def __init__(self, extras: Mapping[str, Any]) -> None:
        self.extras = dict(extras)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint["polyfuse"] = self.extras


class SafetensorsCheckpointIO(CheckpointIO):
    """Lightning's checkpoint I/O through :func:`write_checkpoint` / :func:`read_checkpoint`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        write_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = read_checkpoint(path)
        if map_location is not None and not callable(map_location):
            checkpoint = _move(checkpoint, map_location)
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        if os.path.exists(path):
            os.remove(path)


def _move(value: Any, device: Any) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _move(v, device) for key, v in value.items()}
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    return value


class SafetensorsModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, writing ``<name>.safetensors`` files.

    ``save_weights_only`` defaults to whether a ``monitor`` is given: the checkpoint
    kept for its validation score holds what using the model needs (the weights, the
    run's extras from :class:`CheckpointExtras`, the epoch), the unmonitored one (``last``)
    everything resuming needs (:data:`RESUME_ONLY_KEYS`: the optimiser, schedulers and
    callbacks, with the early-stopping and best-score state). Lightning's own weights-only
    checkpoints would lack the extras (it calls no callback's ``on_save_checkpoint`` for
    them): here :class:`CheckpointExtras` adds them.

    Its saved state names files by absolute paths; Lightning drops the best score
    when the directory differs on resume (a moved or copied run). Here the saved
    paths are re-rooted in the current directory, so a moved run keeps its best
    score and resumes to the same result.
    """

    FILE_EXTENSION = ".safetensors"

    def __init__(self, *args: Any, save_weights_only: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, save_weights_only=bool(save_weights_only), **kwargs)
        if save_weights_only is None:
            self.save_weights_only = self.monitor is not None

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        if not self.save_weights_only:
            super()._save_checkpoint(trainer, filepath)
            return
        # Lightning's Trainer.save_checkpoint(filepath, weights_only=True), with the run's
        # extras, which a weights-only dump leaves out (it calls no callback's hook)
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=True)
        for callback in trainer.callbacks:
            if isinstance(callback, CheckpointExtras):
                callback.on_save_checkpoint(trainer, trainer.lightning_module, checkpoint)
        trainer.strategy.save_checkpoint(checkpoint, filepath)
        trainer.strategy.barrier("Trainer.save_checkpoint")
        # and the bookkeeping of ModelCheckpoint._save_checkpoint
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_dir = state_dict.get("dirpath")
        if saved_dir is not None and self.dirpath is not None and saved_dir != self.dirpath:
            def moved(path: Any) -> Any:
                if isinstance(path, str) and path and os.path.dirname(path) == saved_dir:
                    return os.path.join(self.dirpath, os.path.basename(path))
                return path

            state_dict = {
                **state_dict,
                "dirpath": self.dirpath,
                **{key: moved(state_dict[key]) for key in ("best_model_path", "kth_best_model_path", "last_model_path") if key in state_dict},
            }
            if isinstance(state_dict.get("best_k_models"), dict):
                state_dict["best_k_models"] = {moved(k): v for k, v in state_dict["best_k_models"].items()}
        super().load_state_dict(state_dict)


def load_state(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The weights (``state_dict``) of a checkpoint and what polyfuse stored beside them."""
    checkpoint = read_checkpoint(path)
    if "state_dict" not in checkpoint or "polyfuse" not in checkpoint:
        raise ValueError(f"{path}: not a polyfuse training checkpoint (no state_dict / polyfuse entry)")
    extras = checkpoint["polyfuse"]
    check_extras(extras, path)
    check_version(extras, path)
    check_finite_state(checkpoint["state_dict"], path)
    return checkpoint["state_dict"], extras


def check_version(extras: Mapping[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint whose configuration records a polyfuse older than
    :data:`~polyfuse.engine.config.OLDEST_READABLE`, or none, naming its run's
    ``config.yaml`` (``RUN/checkpoints/*.safetensors``) to retrain with."""
    config = extras.get("config")
    if not isinstance(config, Mapping):  # check_extras says what is wrong with it
        return
    path = Path(path)
    run_config = path.parent.parent / "config.yaml"
    known = path.parent.name == "checkpoints" and run_config.is_file()
    check_written_by(config, path, saved=True, config_file=run_config if known else None)


EXTRAS_KEYS = ("config", "modalities", "input_dims", "label_info", "stats")


def check_extras(extras: Any, path: str | Path) -> None:
    """Refuse polyfuse metadata that lacks what rebuilding the model needs, or has NaN statistics."""
    if not isinstance(extras, Mapping):
        raise ValueError(f"{path}: the polyfuse metadata is a {type(extras).__name__}, not a mapping")
    missing = [key for key in EXTRAS_KEYS if key not in extras]
    if missing:
        raise ValueError(
            f"{path}: the checkpoint metadata lacks {', '.join(missing)}; it cannot be used "
            "(was it written by polyfuse train?)"
        )
    if not isinstance(extras["config"], Mapping):
        raise ValueError(f"{path}: the stored config is a {type(extras['config']).__name__}, not a mapping")
    stats = extras["stats"]
    if not isinstance(stats, Mapping):
        raise ValueError(f"{path}: the stored feature statistics are not a mapping")
    for name, entry in stats.items():
        for key in ("mean", "std"):
            value = entry.get(key) if isinstance(entry, Mapping) else None
            if not isinstance(value, Tensor):
                raise ValueError(f"{path}: the feature statistics of {name!r} lack {key!r}")
            if not bool(value.isfinite().all()):
                raise ValueError(f"{path}: the stored feature {key} of {name!r} holds NaN or Inf; the checkpoint is broken")


def check_finite_state(state_dict: Mapping[str, Any], path: str | Path) -> None:
    """Refuse weights that hold NaN or Inf (a diverged or corrupted run), naming the first."""
    for name, value in state_dict.items():
        if isinstance(value, Tensor) and value.is_floating_point() and not bool(value.isfinite().all()):
            raise ValueError(
                f"{path}: weight {name!r} holds NaN or Inf (the run diverged or the file is "
                "corrupted); this checkpoint is not used"
            )

