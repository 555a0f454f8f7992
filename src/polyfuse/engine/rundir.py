"""Run directories that two processes can never share, and files that are never half-written.

- :func:`claim_run_dir` creates the run directory at the start of a run and locks
  it (an advisory ``fcntl`` lock on ``run.lock``, released by the kernel when the
  process dies, so a killed run never leaves a stale lock). A generated name that
  is taken moves on to ``name_1``, ``name_2``, ...; a directory named by the user
  (``--out``, ``--resume``) that another process holds is an error.
- :func:`atomic_write_text` and :func:`atomic_temp_path` write to a uniquely
  named temporary file beside the target and rename it over the target, so a
  reader sees the old file or the new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from polyfuse.atomic import atomic_temp_path, atomic_write_text, write_bytes

__all__ = [
    "BAD_INPUT_NAME",
    "DATA_HASHES_NAME",
    "LOCK_NAME",
    "RunDirLock",
    "atomic_temp_path",
    "atomic_write_text",
    "best_checkpoint",
    "check_data_hashes",
    "claim_run_dir",
    "file_digest",
    "record_bad_input",
    "record_data_hashes",
    "safe_run_name",
    "write_bytes",
]

LOCK_NAME = "run.lock"
#: the content hashes of the data files a run read, written when it starts
DATA_HASHES_NAME = "data_hashes.json"
BAD_INPUT_NAME = "bad_input.json"  # the data files a run stopped on as bad input (check_data_hashes)
_MAX_NUMBERED = 10_000


class RunDirLock:
    """An exclusive lock on a run directory, held until :meth:`release`."""

    def __init__(self, run_dir: Path, *, created: bool = False) -> None:
        self.run_dir = run_dir
        #: the directory was made by this claim (removed again by :meth:`discard_if_unused`)
        self.created = created
        self._fd: int | None = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise ValueError(
                f"run directory {run_dir} is in use by another polyfuse process; "
                "wait for it to finish or write this run elsewhere (--out DIR)"
            ) from None

    def discard_if_unused(self) -> None:
        """After a failed start: remove ``run.lock`` when nothing else was written beside it,
        and the directory when this claim created it; a failed run leaves no empty lock.
        Called while the lock is held, so no other process can have claimed the directory."""
        if self._fd is None or any(p.name not in (LOCK_NAME, DATA_HASHES_NAME) for p in self.run_dir.iterdir()):
            return
        with contextlib.suppress(OSError):
            (self.run_dir / DATA_HASHES_NAME).unlink(missing_ok=True)
            (self.run_dir / LOCK_NAME).unlink()
            if self.created:
                self.run_dir.rmdir()

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def best_checkpoint(run_dir: Path) -> Path:
    """The best checkpoint of a run directory: results.json's, else checkpoints/best.safetensors."""
    results = run_dir / "results.json"
    if results.is_file():
        return run_dir / json.loads(results.read_text())["best_checkpoint"]
    path = run_dir / "checkpoints" / "best.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no best checkpoint in {run_dir} (results.json or checkpoints/best.safetensors)")
    return path


def safe_run_name(name: str) -> str:
    """``name`` when it is one plain directory name (no ``/``, ``..``, or absolute path)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(
            f"run name {name!r} must be a plain directory name (no '/', '..'); "
            "runs are always written below output_dir"
        )
    return name


def claim_run_dir(path: Path, *, generated: bool, fresh: bool = True) -> tuple[Path, RunDirLock]:
    """Create (or, for ``fresh=False``, open) and lock a run directory.

    Args:
        path: the wanted directory.
        generated: the name was made up by polyfuse (``output_dir/name``): when it is
            taken, ``name_1``, ``name_2``, ... are tried, each created atomically.
        fresh: a new run; an existing run in a user-named directory is refused
            instead of being overwritten. ``False`` when resuming.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if generated:
        for number in range(_MAX_NUMBERED):
            candidate = path if number == 0 else path.with_name(f"{path.name}_{number}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            try:
                return candidate, RunDirLock(candidate, created=True)
            except ValueError:  # pragma: no cover - another process won the race for it
                continue
        raise ValueError(f"{path.parent}: no free run name {path.name}_N below {_MAX_NUMBERED}")
    if path.exists() and not path.is_dir():
        raise ValueError(f"run directory {path} is a file, not a directory; choose another --out")
    existed = path.exists()
    path.mkdir(exist_ok=True)
    lock = RunDirLock(path, created=not existed)
    if fresh and (path / "config.yaml").exists():
        lock.release()
        raise ValueError(
            f"{path} already holds a run; continue it with --resume {path} or write to another directory"
        )
    return path, lock


def file_digest(path: Path) -> str:
    """The sha256 of a file's content, or of a folder's files (their relative names and
    contents, in sorted order)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(f"{file.relative_to(path)}\0".encode())
        with file.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def record_data_hashes(run_dir: Path, files: Mapping[str, Path]) -> None:
    """Write ``data_hashes.json``: ``{key: {"path", "sha256"}}`` of the data files a run reads."""
    content = {key: {"path": str(path), "sha256": file_digest(path)} for key, path in files.items()}
    atomic_write_text(run_dir / DATA_HASHES_NAME, json.dumps(content, indent=1))


def record_bad_input(run_dir: Path, message: str) -> None:
    """Remember that the run stopped on bad input in the data files its message names
    (``bad_input.json``), so that ``--resume`` accepts them repaired."""
    recorded = _recorded_hashes(run_dir)
    named = sorted(key for key, entry in recorded.items() if str(entry["path"]) in message)
    if named:
        atomic_write_text(run_dir / BAD_INPUT_NAME, json.dumps({"files": named, "error": message}, indent=1))


def check_data_hashes(run_dir: Path) -> list[str]:
    """Refuse to resume a run whose data files changed since it started (``data_hashes.json``;
    a run written before polyfuse recorded them is not checked). A file the run stopped on
    as bad input (:func:`record_bad_input`) may have changed: it was repaired; its new hash
    is recorded. Returns a line for each such file."""
    recorded = _recorded_hashes(run_dir)
    repaired_path = run_dir / BAD_INPUT_NAME
    repaired = set(json.loads(repaired_path.read_text(encoding="utf-8")).get("files", [])) if repaired_path.is_file() else set()
    notes = []
    for key, entry in recorded.items():
        path, sha256 = Path(entry["path"]), str(entry["sha256"])
        if not path.exists():
            raise FileNotFoundError(f"cannot resume {run_dir}: its data file {path} ({key}) is gone")
        now = file_digest(path)
        if now != sha256 and key in repaired:
            entry["sha256"] = now
            notes.append(f"{path} ({key}) changed since the run stopped on bad input in it: resuming with the repaired file")
        elif now != sha256:
            raise ValueError(
                f"cannot resume {run_dir}: {path} ({key}) changed since the run started (sha256 {sha256[:12]}..., "
                f"now {now[:12]}...); resume with the original file or start a new run"
            )
    if repaired:
        atomic_write_text(run_dir / DATA_HASHES_NAME, json.dumps(recorded, indent=1))
        repaired_path.unlink()
    return notes


def _recorded_hashes(run_dir: Path) -> dict[str, dict[str, str]]:
    recorded_path = run_dir / DATA_HASHES_NAME
    if not recorded_path.is_file():
        return {}
    try:
        recorded = json.loads(recorded_path.read_text(encoding="utf-8"))
        if not all(isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str) for e in recorded.values()):
            raise ValueError("not the fields a run writes")
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ValueError(f"{recorded_path}: broken (not the JSON polyfuse writes); the run's data cannot be checked") from None
    return recorded
