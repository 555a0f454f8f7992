"""Entry point of the ``polyfuse`` command.

Each sub-command lives in its own module of this package, which provides
``add_parser(subparsers)`` (registering its arguments) and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Sub-command name -> module in polyfuse.cli implementing it.
COMMANDS = {
    "demo": "polyfuse.cli.demo",
    "bench": "polyfuse.cli.bench",
    "train": "polyfuse.cli.train",
    "evaluate": "polyfuse.cli.evaluate",
    "predict": "polyfuse.cli.predict",
    "compare": "polyfuse.cli.compare",
    "plot": "polyfuse.cli.plot",
    "retrieval": "polyfuse.cli.retrieval",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polyfuse", description="High-order multimodal fusion: train, evaluate, benchmark."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        # Bad input is reported as one clear line, not a traceback.
        print(f"polyfuse {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
