"""Atomic file writes: a file is either its old content or its whole new content.

Every file polyfuse writes for a run (checkpoints, results, predictions, caches, CSV
tables) goes through :func:`atomic_temp_path`: it is written under a temporary name
beside its target and renamed onto it when complete, so an interrupted write never
leaves a half-written file under the real name.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["atomic_temp_path", "atomic_write_text", "write_bytes", "write_csv"]


@contextlib.contextmanager
def atomic_temp_path(path: Path) -> Iterator[Path]:
    """A unique temporary path beside ``path``; renamed onto ``path`` when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(fd)
    temp = Path(name)
    try:
        try:
            yield temp
            os.replace(temp, path)
        except OSError as error:  # a full disk: name the file being written, not its temporary name
            if error.filename in (None, str(temp), temp) and error.errno is not None:
                raise OSError(error.errno, error.strerror or str(error), str(path)) from None
            raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to the disk (inside :func:`atomic_temp_path`)."""
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (write a temporary file, then rename)."""
    with atomic_temp_path(Path(path)) as temp, temp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def write_csv(path: Path, rows: Sequence[Mapping[str, object]], fields: Sequence[str] | None = None) -> None:
    """Write ``rows`` as CSV to ``path`` atomically; the columns are ``fields`` or every
    key of the rows in order of first appearance."""
    if fields is None:
        fields = list(dict.fromkeys(key for row in rows for key in row)) or ["row"]
    with atomic_temp_path(Path(path)) as temp, temp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
