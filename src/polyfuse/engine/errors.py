"""Failures of a run that the command line reports with their own exit codes.

Kept free of heavy imports (no torch, no Lightning), so that ``polyfuse demo``
can report them without the train extra.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DivergenceError", "RunInterrupted"]


class DivergenceError(ValueError):
    """Training diverged: the loss or the weights became NaN or Inf."""


class RunInterrupted(Exception):
    """Training was stopped by Ctrl-C (SIGINT); the run directory can be resumed."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"interrupted; the run can be resumed with: polyfuse train --resume {run_dir}")
        self.run_dir = run_dir
