"""Entry point of the ``polyfuse`` command.

Each sub-command lives in its own module of this package, which provides
``add_parser(subparsers)`` (registering its arguments) and ``run(args) -> int``.

Exit codes (documented in docs/RELIABILITY.md):

- 0: success;
- 2: bad input: a wrong flag, configuration value or data file (one line on stderr);
- 3: the machine refused: disk full, read-only or missing permission, a path that is
  a directory, ... (one line naming the path);
- 4: training diverged (NaN / Inf loss or weights);
- 130: interrupted (Ctrl-C); a training run says how to resume it;
- 1: an unexpected error (a bug: a traceback is printed); also ``polyfuse bench peers
  --against`` when a ratio regressed against the baseline (docs/TESTING.md).

Warnings, Python's and those polyfuse logs, are one line each on stderr,
``polyfuse <command>: warning: ...``, every message once per command.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["EXIT_DIVERGED", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_SYSTEM", "main", "one_line_warnings"]

EXIT_INPUT, EXIT_SYSTEM, EXIT_DIVERGED, EXIT_INTERRUPTED = 2, 3, 4, 130

# errno -> what to do about it
_ADVICE = {
    errno.ENOSPC: "the disk is full; free some space",
    errno.EDQUOT: "the disk quota is exceeded; free some space",
    errno.EROFS: "the file system is read-only; write elsewhere (--out or output_dir)",
    errno.EACCES: "permission denied; write elsewhere or fix the folder's permissions",
    errno.EPERM: "operation not permitted; write elsewhere or fix the folder's permissions",
    errno.EISDIR: "it is a directory; give a file path",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
}


def _system_message(error: OSError) -> str:
    path = error.filename or "(unknown path)"
    advice = _ADVICE.get(error.errno or 0, error.strerror or str(error))
    message = f"cannot write or read {path}: {advice}"
    run_dir = getattr(error, "polyfuse_run_dir", None)
    if run_dir is not None and (Path(run_dir) / "checkpoints" / "last.safetensors").is_file():
        message += f"; the run stopped cleanly and can be resumed: polyfuse train --resume {run_dir}"
    return message

# Sub-command name -> module in polyfuse.cli implementing it.
COMMANDS = {
    "demo": "polyfuse.cli.demo",
    "bench": "polyfuse.cli.bench",
    "train": "polyfuse.cli.train",
    "evaluate": "polyfuse.cli.evaluate",
    "predict": "polyfuse.cli.predict",
    "compare": "polyfuse.cli.compare",
    "plot": "polyfuse.cli.plot",
    "extract": "polyfuse.cli.extract",
    "vqa": "polyfuse.cli.vqa",
    "grounding": "polyfuse.cli.grounding",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="polyfuse", description="High-order multimodal fusion: train, evaluate, benchmark."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


class _OneLineWarnings(logging.Handler):
    """Says each warning of a command once, in one line: ``polyfuse <command>: warning: ...``.

    Python warnings (through :func:`warnings.showwarning`) and the warnings polyfuse logs
    both come here; a message said before in the same command is not said again (the
    runs of ``polyfuse compare`` repeat theirs). In a data-parallel run only the first
    process speaks: the others re-run the command on the same data and would repeat it."""

    def __init__(self, command: str) -> None:
        super().__init__(logging.WARNING)
        from polyfuse.engine.run import is_worker

        self.command = command
        self.said: set[str] = set()
        self.silent = is_worker()

    def say(self, message: object) -> None:
        text = " ".join(str(message).split())  # one line, whatever the message holds
        if text not in self.said and not self.silent:
            self.said.add(text)
            from tqdm import tqdm

            # above a progress bar when one is drawn (extract's, Lightning's), a plain line otherwise
            tqdm.write(f"polyfuse {self.command}: warning: {text}", file=sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())

    def showwarning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.say(message)


@contextlib.contextmanager
def one_line_warnings(command: str) -> Iterator[None]:
    """Within: every warning once, as one line naming the command (:class:`_OneLineWarnings`)."""
    handler = _OneLineWarnings(command)
    logger = logging.getLogger("polyfuse")
    # The filters stay as they are (the user's -W, Lightning's noise filtered in
    # polyfuse.engine.build): a warning they let through comes to the handler, which
    # says each message once, whichever line or run raised it.
    with warnings.catch_warnings():
        warnings.showwarning = handler.showwarning
        logger.addHandler(handler)
        try:
            yield
        finally:
            logger.removeHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from polyfuse.engine.errors import (
        DivergenceError,
        LoaderWorkerDied,
        RunInterrupted,
        original_message,
    )

    def fail(message: str, code: int) -> int:
        print(f"polyfuse {args.command}: error: {message}", file=sys.stderr)
        return code

    # Every expected failure is one clear line, not a traceback.
    try:
        with one_line_warnings(args.command):
            return int(args.run(args) or 0)
    except RunInterrupted as error:
        return fail(str(error), EXIT_INTERRUPTED)
    except LoaderWorkerDied as error:
        return fail(str(error), EXIT_SYSTEM)
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    except DivergenceError as error:
        return fail(str(error), EXIT_DIVERGED)
    except FileNotFoundError as error:
        return fail(str(error) if not error.filename else f"not found: {error.filename}", EXIT_INPUT)
    except OSError as error:
        return fail(_system_message(error), EXIT_SYSTEM)
    except ValueError as error:
        return fail(original_message(error), EXIT_INPUT)


if __name__ == "__main__":
    sys.exit(main())
