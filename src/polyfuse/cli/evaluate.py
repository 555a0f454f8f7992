"""``polyfuse evaluate``: the metrics of a checkpoint on one split."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="metrics of a checkpoint on a split",
        description="Rebuild the model of a .safetensors checkpoint (its configuration, "
        "standardisation and label encoding are stored in it) and compute the task's metrics.",
    )
    parser.add_argument("--checkpoint", required=True, help="a .safetensors checkpoint written by polyfuse train")
    parser.add_argument("--split", default="test", help="train, val, test, or all (every row; default test)")
    parser.add_argument("--data", help="another data source with the same modalities (default: the training one)")
    parser.add_argument(
        "--modalities", help="comma-separated arrays of --data standing for the checkpoint's modalities, in order"
    )
    parser.add_argument(
        "--shuffle-words", action="store_true", default=None,
        help="retrieval, chimera: rank the test split with the words of each caption shuffled (Chimera's EX2, "
        "the shuffle of results.json's test_shuffled_words)",
    )  # fmt: skip
    parser.add_argument("--out", help="also write the metrics as JSON here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.build import quiet_lightning
    from polyfuse.engine.run import evaluate
    from polyfuse.engine.rundir import atomic_write_text

    quiet_lightning()
    metrics = evaluate(args.checkpoint, split=args.split, source=args.data, modalities=args.modalities,
                       shuffle_words=args.shuffle_words)
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(metrics, indent=2) + "\n")
    return 0
