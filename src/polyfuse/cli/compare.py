"""``polyfuse compare``: several models over several seeds, one table of mean ± std."""

from __future__ import annotations

import argparse
from pathlib import Path

from polyfuse.cli.options import add_config_arguments, config_from_args, lightning_errors

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="train several models with several seeds; mean and std table",
        description=(
            "Train every model of --models with --seeds seeds (seed, seed+1, ...) on the same "
            "splits, test each run's best validation checkpoint once, and write runs.csv, "
            "summary.csv and summary.md (mean ± sample std over seeds)."
        ),
    )
    add_config_arguments(parser, config_required=True)
    parser.add_argument(
        "--models", required=True,
        help="comma-separated fusion names (man,ban,tfn,lmf,concat) or YAML configs whose model "
        "and optim sections replace those of --config",
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per model (default 5)")
    parser.add_argument("--out", help="directory for the runs and tables (default output_dir/compare/<name>)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.compare import compare, parse_models

    config = config_from_args(args)
    models = parse_models(args.models)
    out = Path(args.out) if args.out else Path(config["output_dir"]) / "compare" / (config["name"] or "compare")
    with lightning_errors():
        compare(config, models, seeds=args.seeds, out_dir=out)
    print()
    print((out / "summary.md").read_text().rstrip())
    print(f"\ntables: {out / 'summary.md'}, {out / 'summary.csv'}; runs: {out / 'runs.csv'}")
    return 0
