"""``polyfuse train``: train one model, pick the best checkpoint on validation, test it once."""

from __future__ import annotations

import argparse

from polyfuse.cli.options import add_config_arguments, config_from_args, lightning_errors

__all__ = ["add_parser", "format_metrics", "run"]


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
    parser.set_defaults(run=run)


def format_metrics(title: str, metrics: dict[str, float]) -> str:
    return f"{title}: " + ", ".join(f"{key} {value:.4f}" for key, value in metrics.items())


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.run import _is_worker, train

    if args.resume and (args.config or args.overrides):
        raise ValueError("--resume continues a run with its saved configuration; drop --config and --set")
    config = None if args.resume else config_from_args(args)
    if config is None and not args.resume:
        raise ValueError("give --config (or --resume)")
    with lightning_errors():
        result = train(config or {}, resume=args.resume, run_dir=args.out)
    if not _is_worker():
        print(f"run directory: {result.run_dir}")
        print(f"best checkpoint: {result.best_checkpoint} ({result.epochs} epochs, {result.train_seconds:.1f} s)")
        print(format_metrics("validation", result.validation))
        if result.test:
            print(format_metrics("test", result.test))
    return 0
