"""``polyfuse evaluate``: the metrics of a checkpoint on one split."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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


def _evaluate_with(checkpoint: str, split: str, source: str | None, modalities: str | None,
                   options: dict[str, Any]) -> dict[str, float]:
    """The metrics of a checkpoint with the task's own evaluation options
    (:attr:`~polyfuse.tasks.registry.TaskSpec.evaluate_options`); another task refuses them."""
    from polyfuse.engine.run import AppliedCheckpoint, evaluate_applied, load_model
    from polyfuse.tasks.registry import task_spec

    module, extras = load_model(checkpoint)
    spec = task_spec(extras["config"]["task"]["type"])
    foreign = [name for name in options if name not in spec.evaluate_options]
    if foreign:
        flags = " and ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags} do(es) not apply to a {spec.name} checkpoint")
    if spec.reads_own_files and (source is not None or modalities is not None):
        raise ValueError(f"a {spec.name} checkpoint reads the files of its configuration: drop --data / --modalities")
    data = spec.checkpoint_data(extras, split=split, source=source, modalities=modalities, **options)
    return evaluate_applied(AppliedCheckpoint(spec, module, extras, data, split))


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.build import quiet_lightning
    from polyfuse.engine.run import evaluate
    from polyfuse.engine.rundir import atomic_write_text

    quiet_lightning()
    options = {name: value for name, value in (("shuffle_words", args.shuffle_words),) if value is not None}
    if options:
        metrics = _evaluate_with(args.checkpoint, args.split, args.data, args.modalities, options)
    else:
        metrics = evaluate(args.checkpoint, split=args.split, source=args.data, modalities=args.modalities)
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"{key:<{width}}  {value:.4f}")
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(metrics, indent=2) + "\n")
    return 0
