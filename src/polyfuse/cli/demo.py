"""``polyfuse demo``: fusion methods side by side on a planted three-way interaction."""

from __future__ import annotations

import argparse
import time

from polyfuse.demo import format_table, run_demo

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train MAN, BAN and baselines on a synthetic three-way interaction",
        description=(
            "Generate, with a fixed seed, a dataset whose label is the parity of three "
            "signs planted at nearby time steps of three modalities; train MAN (had and "
            "exact), BAN on two modalities, Concat, TFN and LMF; print test accuracy, "
            "parameters and seconds per epoch."
        ),
    )
    parser.add_argument("--samples", type=int, default=3000, help="dataset size (default 3000)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs (default 12)")
    parser.add_argument("--seed", type=int, default=0, help="data and training seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument("--quiet", action="store_true", help="print only the results (the table and the time)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.samples < 20 or args.epochs < 1:
        raise ValueError("--samples must be >= 20 and --epochs >= 1")
    start = time.perf_counter()
    results = run_demo(
        num_samples=args.samples, epochs=args.epochs, seed=args.seed, progress=not (args.no_progress or args.quiet)
    )
    if not args.quiet:
        print()
    print(format_table(results))
    print(f"\nTotal time: {time.perf_counter() - start:.0f} s")
    return 0
