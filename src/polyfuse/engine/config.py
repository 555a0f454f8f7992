"""Run configuration: defaults, YAML files, ``key=value`` overrides, validation.

A configuration is a nested dict with the sections of :data:`DEFAULTS` (see
docs/TRAINING.md for every key). A YAML file may start from another with
``base: other.yaml`` (a path relative to the file); its keys then override the
base's, section by section. :func:`resolve_config` fills in the defaults and
refuses unknown keys, naming the known ones.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULTS",
    "apply_overrides",
    "deep_merge",
    "dump_config",
    "load_config",
    "parse_value",
    "resolve_config",
]

DEFAULTS: dict[str, Any] = {
    "name": None,  # run name: the directory under output_dir (default: config file name)
    "seed": 0,
    "output_dir": "runs",
    "task": {
        "type": "sentiment",  # sentiment | traits | classification
        "loss": "l1",  # regression: l1 | mse | smooth_l1
        "target_names": None,  # traits: one name per target column
        "target_ranges": None,  # traits: [[low, high], ...] (default: from training labels)
        "label_smoothing": 0.0,  # classification
    },
    "data": {
        "source": None,  # .npz / .h5 path, or synthetic:key=value,...
        "modalities": None,  # array names, in order
        "label": "label",
        "padding": "auto",  # word-aligned directories: left (CMU / MFN) | right | auto (detected)
        "split": None,  # split array name (values train / valid / test)
        "split_values": None,  # {train: [...], valid: [...], test: [...]} other split names
        "group": None,  # group array for carving held-out parts (default: context.group_by)
        "id": None,  # id array written next to predictions
        "context": None,  # {group_by, order_by, window}: contextual mode
        "validation_fraction": 0.15,
        "test_fraction": 0.2,  # only without a split array
        "split_seed": 0,
        "standardize": True,
        "nonfinite": "error",  # error | zero | mean
        "batch_size": 32,  # global batch (all processes together)
        "eval_batch_size": 256,
    },
    "model": {
        "backbone": "fusion",  # fusion (encoders + fusion) | a name of polyfuse.nn.backbones.available()
        "fusion": "man",  # a name of polyfuse.nn.available(); with a backbone: its extra module, or none
        "fusion_dim": 64,  # fusion module out_dim
        "out_dim": 64,  # backbone output (after the projection)
        "dropout": 0.1,  # after the projection
        "skip": True,  # concatenate each modality's own (centre) step to the fused vector
        "encoder": {"type": "linear", "hidden_dim": 64, "dropout": 0.1},  # none | linear | gru
        "options": {},  # {fusion name: {keyword arguments}}
        "input_groups": {},  # {fusion name: [[modality, ...], ...]}
    },
    "optim": {"lr": 1e-3, "weight_decay": 0.0, "scheduler": "none"},
    "trainer": {
        "max_epochs": 30,
        "min_epochs": 1,
        "patience": 10,  # early stopping on the monitored metric; 0 disables
        "monitor": None,  # default: val/mae (regression), val/loss (classification)
        "mode": None,  # min | max (default from the monitor)
        "accelerator": "auto",
        "devices": 1,
        "strategy": "auto",  # ddp for several processes (gloo on CPU)
        "precision": "32-true",  # or bf16-mixed
        "gradient_clip_val": None,
        "deterministic": True,
        "progress_bar": True,
        "log_every_n_steps": 10,
        "num_threads": None,  # torch CPU threads per process
        "quiet": False,  # hide Lightning's info messages
    },
}

# Sections whose keys are free (names of fusion modules, partitions, ...).
_FREE = {("data", "split_values"), ("data", "context"), ("model", "options"), ("model", "input_groups")}
_CONTEXT_KEYS = ("group_by", "order_by", "window")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string; numbers in exponent form are floats here."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$"),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A ``--set`` value: YAML (numbers, true/false, null, [lists], {maps}) or a string."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, recursively for dicts (lists are replaced)."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_config(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML configuration, following ``base:`` links."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ValueError(f"{path}: circular base: chain")
    try:
        content = yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of sections, got {type(content).__name__}")
    base = content.pop("base", None)
    if base is not None:
        content = deep_merge(load_config(path.parent / base, (*_seen, path.resolve())), content)
    return content


def apply_overrides(config: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed by :func:`parse_value`)."""
    result = copy.deepcopy(dict(config))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad --set {item!r}: write key=value, for example trainer.max_epochs=5")
        parts = key.strip().split(".")
        node = result
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = parse_value(text)
    return result


def _check_keys(config: Mapping[str, Any], defaults: Mapping[str, Any], where: tuple[str, ...]) -> None:
    for key, value in config.items():
        dotted = ".".join((*where, key))
        if key not in defaults:
            known = ", ".join(sorted(defaults))
            raise ValueError(f"unknown config key {dotted!r}; known keys{' under ' + repr('.'.join(where)) if where else ''}: {known}")
        if (*where, key) in _FREE:
            continue
        if isinstance(defaults[key], dict):
            if not isinstance(value, Mapping):
                raise ValueError(f"config key {dotted!r} must be a mapping, got {value!r}")
            _check_keys(value, defaults[key], (*where, key))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def resolve_config(config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full configuration: defaults filled in, keys and values checked."""
    config = dict(config or {})
    _check_keys(config, DEFAULTS, ())
    resolved = deep_merge(DEFAULTS, config)
    data, model, trainer, optim = resolved["data"], resolved["model"], resolved["trainer"], resolved["optim"]
    context = data["context"]
    if context is not None:
        _require(isinstance(context, Mapping), "data.context must be a mapping {group_by, order_by, window}")
        unknown = sorted(set(context) - set(_CONTEXT_KEYS))
        _require(not unknown, f"unknown data.context key(s) {unknown}; known: {', '.join(_CONTEXT_KEYS)}")
        _require(bool(context.get("group_by")), "data.context needs group_by (the recording of each row)")
        data["context"] = {"group_by": None, "order_by": None, "window": None, **context}
    if isinstance(data["modalities"], str):
        data["modalities"] = [m.strip() for m in data["modalities"].split(",") if m.strip()]
    for key in ("batch_size", "eval_batch_size"):
        _require(isinstance(data[key], int) and data[key] >= 1, f"data.{key} must be a positive integer, got {data[key]!r}")
    _require(0 < float(data["validation_fraction"]) < 1, "data.validation_fraction must lie in (0, 1)")
    for section, key in (("trainer", "max_epochs"), ("trainer", "devices"), ("trainer", "min_epochs")):
        value = resolved[section][key]
        _require(isinstance(value, int) and value >= 1, f"{section}.{key} must be a positive integer, got {value!r}")
    _require(isinstance(trainer["patience"], int) and trainer["patience"] >= 0, "trainer.patience must be an integer >= 0")
    _require(trainer["mode"] in (None, "min", "max"), f"trainer.mode must be min or max, got {trainer['mode']!r}")
    for key in ("lr", "weight_decay"):
        try:
            optim[key] = float(optim[key])
        except (TypeError, ValueError):
            raise ValueError(f"optim.{key} must be a number, got {optim[key]!r}") from None
    _require(isinstance(model["fusion"], str) and bool(model["fusion"]), "model.fusion must name a fusion module")
    _require(isinstance(model["backbone"], str) and bool(model["backbone"]), "model.backbone must name a backbone")
    _require(model["fusion"] != "none" or model["backbone"] != "fusion",
             "model.fusion: none needs a backbone (model.backbone: mult or lstm_lmf)")
    _require(isinstance(model["options"], Mapping), "model.options must map fusion names to keyword arguments")
    _require(isinstance(model["input_groups"], Mapping), "model.input_groups must map fusion names to groups")
    _require(isinstance(resolved["seed"], int), f"seed must be an integer, got {resolved['seed']!r}")
    return resolved


def dump_config(config: Mapping[str, Any]) -> str:
    """YAML text of a configuration (keys in their given order)."""
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=None)
