"""Long steps (feature extraction, encoding captions, pre-training a head): a progress
bar on a terminal and a final line saying what was done, how much and in how long.

A bar is drawn on stderr only when stderr is a terminal and the caller allows it
(``--no-progress``, ``--quiet``, ``trainer.progress_bar``): a log file or a pipe gets
no carriage-return debris, only the final line. Inside a run, both follow the run's
``trainer`` settings (:func:`run_display`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tqdm import tqdm

__all__ = ["BAR_DELAY", "Stopwatch", "is_terminal", "progress_bar", "run_display", "say"]

#: seconds a step runs before its bar is drawn
BAR_DELAY = 0.5


def is_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default: the current ``sys.stderr``) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _Bar(tqdm):
    """tqdm whose ``n`` counts :meth:`update` even when it is not drawn."""

    def update(self, n: float | None = 1) -> bool | None:
        if self.disable:
            self.n += n
            return None
        return super().update(n)


def progress_bar(iterable: Iterable[Any] | None = None, *, show: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on stderr, drawn only when ``show`` and stderr is a terminal, and only
    once the step has lasted :data:`BAR_DELAY` seconds (a step that ends sooner, such as
    one served by a cache, leaves nothing behind). Otherwise it iterates silently, and
    ``n`` still counts what :meth:`~tqdm.tqdm.update` was given. ``options`` are tqdm's
    (``total``, ``desc``, ``unit``)."""
    drawn = show and is_terminal()
    # a terminal that reports no size (the pty of `script`, some containers): tqdm would
    # draw nothing; $COLUMNS and $LINES, else 80 x 24
    size = {"dynamic_ncols": True} if _columns(sys.stderr) else dict(
        zip(("ncols", "nrows"), shutil.get_terminal_size((80, 24)), strict=True))
    options = {"delay": BAR_DELAY, **size, **options}
    return _Bar(iterable, disable=not drawn, file=sys.stderr, **options)


def _columns(stream: Any) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no file descriptor, or not a terminal
        return 0


def say(line: str) -> None:
    """Print a step's final line on stderr (the results of a command go to stdout)."""
    print(line, file=sys.stderr, flush=True)


def run_display(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(bar, final line)`` of a long step inside a run of ``config``: the bar where
    ``trainer.progress_bar`` is on (``--no-progress`` and ``--quiet`` turn it off), and
    neither under ``trainer.quiet``."""
    trainer = config.get("trainer") or {}
    quiet = bool(trainer.get("quiet", False))
    return bool(trainer.get("progress_bar", True)) and not quiet, not quiet


class Stopwatch:
    """Seconds since it was made: ``f"... in {watch}"`` reads ``... in 61.8 s``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def __str__(self) -> str:
        return f"{self.seconds:.1f} s"
