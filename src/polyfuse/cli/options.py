"""Options shared by ``polyfuse train`` and ``polyfuse compare``: a config file,
``--set key=value`` overrides and shortcuts for the common keys."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["add_config_arguments", "config_from_args", "display_settings", "lightning_errors"]

# flag -> (config key, help)
_SHORTCUTS = {
    "data": ("data.source", "data source: a .npz/.h5 file or synthetic:key=value,..."),
    "modalities": ("data.modalities", "comma-separated modality array names, in order"),
    "label": ("data.label", "label array name"),
    "split": ("data.split", "split array name (values train / valid / test)"),
    "group_by": ("data.context.group_by", "contextual mode: the array naming each row's recording (e.g. video_id)"),
    "order_by": ("data.context.order_by", "contextual mode: the array ordering rows within a recording (e.g. start)"),
    "window": ("data.context.window", "contextual mode: rows per window (0: whole recordings)"),
    "model": ("model.fusion", "fusion module name"),
    "seed": ("seed", "seed of initialisation, shuffling and dropout"),
    "max_epochs": ("trainer.max_epochs", "maximum number of epochs"),
    "batch_size": ("data.batch_size", "global training batch size"),
    "devices": ("trainer.devices", "number of processes (data parallel) or accelerators"),
    "strategy": ("trainer.strategy", "Lightning strategy: auto, ddp, ddp_spawn, ..."),
    "accelerator": ("trainer.accelerator", "cpu, gpu or auto"),
    "precision": ("trainer.precision", "32-true or bf16-mixed (bf16 autocast)"),
    "name": ("name", "run name (directory under output_dir)"),
    "output_dir": ("output_dir", "where runs are written (default runs/)"),
}


def add_config_arguments(parser: argparse.ArgumentParser, *, config_required: bool = False) -> None:
    parser.add_argument("--config", required=config_required, help="YAML configuration file")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a configuration key, e.g. --set optim.lr=0.0005 (repeatable)",
    )
    group = parser.add_argument_group("shortcuts for common keys (same as --set)")
    for flag, (key, text) in _SHORTCUTS.items():
        group.add_argument("--" + flag.replace("_", "-"), dest=f"short_{flag}", metavar=key.split(".")[-1].upper(), help=f"{text} [{key}]")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--quiet", action="store_true",
        help="print only the results and warnings: no progress bar, no Lightning info lines [trainer.quiet]",
    )


def display_settings(args: argparse.Namespace) -> dict[str, bool]:
    """The ``trainer`` settings of --no-progress and --quiet (which hides the bar too)."""
    settings = {}
    if args.no_progress or args.quiet:
        settings["progress_bar"] = False
    if args.quiet:
        settings["quiet"] = True
    return settings


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Config file, then shortcuts, then --set overrides, resolved."""
    from polyfuse.engine.config import apply_overrides, load_config, resolve_config

    config = load_config(args.config) if args.config else {}
    overrides = []
    for flag, (key, _) in _SHORTCUTS.items():
        value = getattr(args, f"short_{flag}", None)
        if value is not None:
            overrides.append(f"{key}={value}")
    overrides.extend(args.overrides)
    overrides.extend(f"trainer.{key}={str(value).lower()}" for key, value in display_settings(args).items())
    config = apply_overrides(config, overrides)
    if not config.get("name") and args.config:
        config["name"] = args.config.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return resolve_config(config)


@contextlib.contextmanager
def lightning_errors() -> Iterator[None]:
    """Turn Lightning's configuration errors into ValueError (a one-line CLI error)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        yield
    except MisconfigurationException as error:
        raise ValueError(str(error)) from None
