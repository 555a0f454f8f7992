"""Failures of a run that the command line reports with their own exit codes.

Kept free of heavy imports (no torch, no Lightning), so that ``polyfuse demo``
can report them without the train extra.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DivergenceError", "LoaderWorkerDied", "RunInterrupted", "original_message"]


class DivergenceError(ValueError):
    """Training diverged: the loss or the weights became NaN or Inf."""


class RunInterrupted(Exception):
    """Training was stopped by Ctrl-C (SIGINT); the run directory can be resumed."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"interrupted; the run can be resumed with: polyfuse train --resume {run_dir}")
        self.run_dir = run_dir


class LoaderWorkerDied(RuntimeError):
    """A data loader worker process died (killed, out of memory); the run can be resumed."""

    def __init__(self, run_dir: Path, cause: str) -> None:
        super().__init__(f"a data loader worker died ({cause.splitlines()[0]}); the last checkpoint is kept: "
                         f"polyfuse train --resume {run_dir} (data.loader_workers: 0 reads in the main process)")
        self.run_dir = run_dir


def original_message(error: BaseException) -> str:
    """The message of ``error``, or of the error it wraps when a data loader worker raised
    it: torch re-raises it in the main process as the same type, with a message of
    ``Caught ValueError in DataLoader worker process 0.`` and the worker's traceback,
    whose last line is ``ValueError: <the message>``."""
    text = str(error)
    if not text.startswith("Caught ") or " in DataLoader worker process " not in text.partition("\n")[0]:
        return text
    prefix = f"{type(error).__name__}: "
    last = next((line for line in reversed(text.splitlines()) if line.startswith(prefix)), None)
    return last[len(prefix):] if last is not None else text
