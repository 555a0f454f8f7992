"""Benchmarks: timing, FLOPs, memory and approximation error, results as JSON.

``polyfuse bench complexity | paper | approximation | targets`` run them from the
command line (:mod:`polyfuse.cli.bench`); ``scripts/write_benchmarks_md.py`` turns
the JSON results into ``docs/BENCHMARKS.md``.
"""

from polyfuse.bench.measure import (
    LoadMonitor,
    Timing,
    count_flops,
    machine_info,
    matmul_flop_rate,
    peak_allocated_bytes,
    time_callable,
    time_interleaved,
)
from polyfuse.bench.results import format_bytes, parse_bytes, read_results, write_results

__all__ = [
    "LoadMonitor",
    "Timing",
    "count_flops",
    "format_bytes",
    "machine_info",
    "matmul_flop_rate",
    "parse_bytes",
    "peak_allocated_bytes",
    "read_results",
    "time_callable",
    "time_interleaved",
    "write_results",
]
