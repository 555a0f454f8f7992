"""Run configuration: defaults, YAML files, ``key=value`` overrides, validation.

A configuration is a nested dict with the sections of :data:`DEFAULTS`; the
schema (keys, types, ranges) is :mod:`polyfuse.engine.schema`, documented in
docs/CONFIGURATION.md. A YAML file may start from another with ``base:
other.yaml`` (a path relative to the file); its keys then override the base's,
section by section. Paths in a file (``data.source``, ``output_dir``) are
relative to that file (so are those of ``data.vqa`` and ``model.vqa.glove``). :func:`resolve_config` fills in the defaults and refuses
unknown keys (with a did-you-mean) and wrong values.

A run records the polyfuse that trained it (``polyfuse_version`` in its ``config.yaml``
and in every checkpoint's configuration). :func:`check_written_by` refuses a saved run or
checkpoint recorded by a polyfuse older than :data:`OLDEST_READABLE`, or recording none,
and a configuration file that states such a version (one that states none is taken as
written for this version).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from polyfuse import __version__

__all__ = [
    "DEFAULTS",  # noqa: F822 - built lazily by __getattr__
    "OLDEST_READABLE",
    "apply_overrides",
    "check_written_by",
    "data_files",
    "deep_merge",
    "dump_config",
    "load_config",
    "parse_value",
    "resolve_config",
]

#: the oldest polyfuse whose checkpoints, saved runs and configuration files this one reads
OLDEST_READABLE = "0.4.0"

# Limits on configuration files, which may come from anyone.
MAX_CONFIG_BYTES = 1 << 20
MAX_ALIASES = 64
MAX_DEPTH = 32
#: the path keys of every task type (a task spec adds its own: TaskSpec.path_keys)
_SHARED_PATH_KEYS = (("data", "source"), ("output_dir",))


def _path_keys() -> tuple[tuple[str, ...], ...]:
    """Every configuration key that names a file (anchored to the config file's folder)."""
    from polyfuse.tasks.registry import task_specs

    tasks = tuple(tuple(key.split(".")) for spec in task_specs() for key in spec.path_keys)
    return _SHARED_PATH_KEYS + tuple(dict.fromkeys(tasks))


def _path_mappings() -> tuple[tuple[str, ...], ...]:
    """Every configuration mapping whose values name files (modality -> feature file)."""
    from polyfuse.tasks.registry import task_specs

    return tuple(dict.fromkeys(tuple(key.split(".")) for spec in task_specs() for key in spec.path_mappings))


class _Loader(yaml.SafeLoader):
    """Safe YAML with exponent floats (``1e-3``) and bounds on aliases and nesting.

    An alias bomb (a few lines that expand to gigabytes) is refused after
    :data:`MAX_ALIASES` aliases; nesting deeper than :data:`MAX_DEPTH` is refused
    before Python's recursion limit is reached.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (*name); refused as a possible alias bomb")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$"),
    list("-+0123456789."),
)


def _defaults() -> dict[str, Any]:
    from polyfuse.engine.schema import RunConfig

    return RunConfig().model_dump()


def __getattr__(name: str) -> Any:
    if name == "DEFAULTS":  # built from the schema on first use
        return _defaults()
    raise AttributeError(name)


def parse_value(text: str) -> Any:
    """A ``--set`` value: YAML (numbers, true/false, null, [lists], {maps}) or a string."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text
    except RecursionError:  # pragma: no cover - bounded by MAX_DEPTH
        raise ValueError("--set value nested too deeply") from None


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, recursively for dicts (lists are replaced)."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def check_written_by(
    config: Any, origin: str | Path, *, saved: bool, config_file: str | Path | None = None
) -> None:
    """Refuse, in one line naming the version and how to retrain, what a polyfuse older
    than :data:`OLDEST_READABLE` wrote.

    ``saved``: ``config`` is a saved run's or a checkpoint's configuration (``origin``), which
    records the polyfuse that wrote it; recording none means one before the record existed.
    Otherwise ``config`` is a configuration a user wrote: a ``polyfuse_version`` it states
    is checked, and none is taken as this version. ``config_file``: the configuration to
    train with again (a saved run's ``config.yaml``), named in the message.
    """
    from polyfuse.engine.schema import version_of

    recorded = config.get("polyfuse_version") if isinstance(config, Mapping) else None
    if recorded is None and not saved:
        return
    if recorded is not None and version_of(recorded) >= Version(OLDEST_READABLE):
        return
    kind = "checkpoints" if str(origin).endswith(".safetensors") else "saved runs" if saved else "configurations"
    reads = f"this is {__version__}, which reads {kind} of {OLDEST_READABLE} and later"
    if not saved:
        how = f"train with polyfuse train --config {config_file}" if config_file else "train with it"
        raise ValueError(
            f"{origin} states polyfuse_version {recorded} ({reads}): check it against CHANGELOG.md, "
            f"delete that line and {how}"
        )
    written = f"was written by polyfuse {recorded}" if recorded is not None else \
        "records no polyfuse_version (written by a polyfuse before 0.2.0)"
    if config_file is None:
        how = "polyfuse train --config and the configuration it was trained with"
    else:
        how = f"polyfuse train --config {config_file}"
        if recorded is not None:  # the saved configuration states the old version too
            how += " after deleting its polyfuse_version line"
    raise ValueError(f"{origin} {written} ({reads}): retrain it with {how}")


def load_config(path: str | Path, _seen: tuple[Path, ...] = (), *, saved: bool = False) -> dict[str, Any]:
    """Read a YAML configuration, following ``base:`` links.

    A file that states a ``polyfuse_version`` older than :data:`OLDEST_READABLE` is
    refused; ``saved``: the file is a saved run's ``config.yaml``, which must record one
    (:func:`check_written_by`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ValueError(f"{path}: circular base: chain")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {path.stat().st_size} bytes; config files are limited to {MAX_CONFIG_BYTES} bytes")
    try:
        content = yaml.load(path.read_bytes().decode("utf-8"), Loader=_Loader) or {}
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: a config file must hold a mapping of sections, got {type(content).__name__}")
    _anchor_paths(content, path.parent)
    base = content.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ValueError(f"{path}: base must be a file name, got {base!r}")
        content = deep_merge(load_config(path.parent / base, (*_seen, path.resolve())), content)
    check_written_by(content, path, saved=saved, config_file=path)
    return content


def _anchor_paths(content: dict[str, Any], folder: Path) -> None:
    """Make the file paths a config file names (data.source, output_dir) relative to its folder.

    They become absolute, so that the saved config.yaml of a run means the same
    from wherever it is read.
    """
    for keys in _path_keys():
        node: Any = content
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(keys[-1]), str):
            continue
        value = node[keys[-1]]
        if not value or value == "synthetic" or value.startswith("synthetic:"):
            continue
        path = Path(value).expanduser()
        node[keys[-1]] = str(path if path.is_absolute() else (folder / path).resolve())
    for keys in _path_mappings():
        node = _node_at(content, keys)
        if isinstance(node, dict):
            for name, value in node.items():
                if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                    node[name] = str((folder / Path(value).expanduser()).resolve())


def _node_at(config: Any, keys: Sequence[str]) -> Any:
    """The value at the nested ``keys`` of a configuration, or None."""
    for key in keys:
        config = config.get(key) if isinstance(config, Mapping) else None
    return config


def data_files(config: Mapping[str, Any]) -> dict[str, Path]:
    """The data files a configuration reads, by dotted key (``data.source``,
    ``data.vqa.train_questions``, ``captioning.features.appearance``, ...): those of its
    path keys that name an existing file or folder (not ``output_dir``, not a synthetic
    source). The file part of a ``PATH#KEY`` spec is used."""
    found: dict[str, Path] = {}

    def add(dotted: str, value: Any) -> None:
        if isinstance(value, str) and value and not value.startswith("synthetic"):
            path = Path(value.split("#", 1)[0]).expanduser()
            if path.exists():
                found[dotted] = path

    for keys in _path_keys():
        if keys != ("output_dir",):
            add(".".join(keys), _node_at(config, keys))
    for keys in _path_mappings():
        node = _node_at(config, keys)
        for name, value in (node.items() if isinstance(node, Mapping) else ()):
            add(".".join((*keys, str(name))), value)
    return found


def apply_overrides(config: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed by :func:`parse_value`)."""
    result = copy.deepcopy(dict(config))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad --set {item!r}: write key=value, for example trainer.max_epochs=5")
        parts = key.strip().split(".")
        node, defaults = result, _defaults()
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            elif not isinstance(node[part], dict):
                raise ValueError(f"bad --set {item!r}: {part!r} holds {node[part]!r}, not a section")
            node = node[part]
            defaults = defaults.get(part) if isinstance(defaults, dict) else None
        value = parse_value(text)
        last = parts[-1]
        # A section has keys of its own (free mappings such as model.options default to {}).
        section = isinstance(defaults, dict) and isinstance(defaults.get(last), dict) and bool(defaults[last])
        if section:
            # A section is merged into, never replaced: --set trainer=3 must not wipe it.
            if not isinstance(value, dict):
                raise ValueError(
                    f"bad --set {item!r}: {key.strip()!r} is a section; set one of its keys "
                    f"(e.g. {key.strip()}.KEY=VALUE) or give a mapping {{key: value}}"
                )
            node[last] = deep_merge(node.get(last) or {}, value)
        else:
            node[last] = value
    return result


def resolve_config(config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The full configuration: defaults filled in, keys, types and ranges checked
    (by the schema of :mod:`polyfuse.engine.schema`)."""
    from polyfuse.engine.schema import validate_config

    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"a configuration must be a mapping of sections, got {type(config).__name__}")
    return validate_config(config or {})


def dump_config(config: Mapping[str, Any]) -> str:
    """YAML text of a configuration (keys in their given order)."""
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=None)
