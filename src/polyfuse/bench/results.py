"""Benchmark results as JSON: a common header, reading, writing, byte sizes."""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path
from typing import Any

from polyfuse.bench.measure import machine_info

__all__ = ["format_bytes", "parse_bytes", "read_results", "result_header", "write_results"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int) -> int:
    """'2GiB', '512 MiB', '1.5e9' or an int -> bytes."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size in bytes (e.g. 2GiB, 512MiB, 1e9)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(size: float | None) -> str:
    """Bytes in binary units, e.g. 1536 -> '1.5 KiB'."""
    if size is None or (isinstance(size, float) and math.isnan(size)):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def result_header(benchmark: str, settings: dict[str, Any], device: Any = "cpu") -> dict[str, Any]:
    """What every result file starts with: which benchmark, when, where (the machine and
    ``device``), with what."""
    from polyfuse import __version__

    return {
        "benchmark": benchmark,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "polyfuse": __version__,
        "machine": machine_info(device),
        "settings": settings,
    }


def write_results(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON (creating the folder); NaN and Inf are refused."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def read_results(path: str | Path) -> dict[str, Any]:
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(payload, dict) or "benchmark" not in payload:
        raise ValueError(f"{path} is not a polyfuse benchmark result (no 'benchmark' key)")
    return payload
