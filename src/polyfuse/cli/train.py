"""``polyfuse train``: train one model, pick the best checkpoint on validation, test it once."""

from __future__ import annotations

import argparse
from pathlib import Path

from polyfuse.cli.options import (
    add_config_arguments,
    config_from_args,
    display_settings,
    lightning_errors,
)

__all__ = ["add_parser", "epoch_words", "format_metrics", "run", "shown_path"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a fusion model from a YAML configuration",
        description=(
            "Train a fusion model with Lightning: checkpoints (best on validation and last, "
            "safetensors), early stopping, CSV and TensorBoard logs, the resolved configuration "
            "and learning curves under the run directory. The test split is evaluated once, "
            "with the best checkpoint."
        ),
    )
    add_config_arguments(parser)
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    parser.add_argument("--out", metavar="DIR", help="write the run here instead of output_dir/name")
    parser.add_argument("--dry-run", action="store_true",
                        help="build the data readers, the model and its optimiser from --config, print their sizes "
                             "and train nothing (no run directory; a text-feature cache a run would use is kept)")
    parser.set_defaults(run=run)


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def epoch_words(result) -> str:
    """``"epoch 3 of 5 trained"``: the epoch whose weights the best checkpoint holds, and
    how many were trained (``"5 epochs trained"`` when the checkpoint does not say)."""
    if result.best_epoch is None:
        return f"{result.epochs} epochs trained"
    return f"epoch {result.best_epoch} of {result.epochs} trained"


def format_metrics(title: str, metrics: dict[str, float]) -> str:
    return f"{title}: " + ", ".join(f"{key} {value:.4f}" for key, value in metrics.items())


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.run import is_worker, train
    from polyfuse.engine.threads import thread_plan_for

    if args.resume:
        given = [flag for flag, value in vars(args).items() if flag.startswith("short_") and value is not None]
        if args.config or args.overrides or given or args.out:
            raise ValueError(
                "--resume continues a run with its saved configuration; only --no-progress and "
                "--quiet may be added"
            )
        config = {"trainer": display_settings(args)}
    elif not args.config:
        raise ValueError("give --config (or --resume RUN_DIR)")
    else:
        config = config_from_args(args)
    if args.dry_run:
        if args.resume or args.out:
            raise ValueError("--dry-run checks a --config; it takes neither --resume nor --out")
        from polyfuse.engine.run import dry_run

        print(dry_run(config).describe())
        return 0
    with lightning_errors():
        result = train(config, resume=args.resume, run_dir=None if args.resume else args.out)
    if not is_worker():
        print(f"run directory: {shown_path(result.run_dir)}")
        print(f"best checkpoint: {shown_path(result.best_checkpoint)} ({epoch_words(result)}, {result.train_seconds:.1f} s)")
        print(thread_plan_for(result.config).describe())
        print(format_metrics("validation", result.validation))
        if result.test:
            print(format_metrics("test", result.test))
    return 0
