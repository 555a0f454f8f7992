"""Measuring one callable: wall time, FLOPs, peak allocated memory; the machine and its load.

What each number means (and does not):

* **Time**: wall-clock seconds of one call, by ``time.perf_counter``, median (and
  min, max) over ``repeats`` calls after ``warmup`` calls. Several callables that are
  compared are timed in turns (a, b, a, b, ...), so that a change of machine load
  during the run hits them alike. On CUDA (:func:`call_timer`) one call is timed by
  two CUDA events recorded around it on the current stream, after a
  ``torch.cuda.synchronize()``, and read once the end event has completed: the
  device's time from the call's first kernel to its last, including the gaps where
  the device waits for the host to launch the next kernel (a launch-bound call is
  not hidden by asynchronous execution).
* **FLOPs**: what ``torch.utils.flop_counter.FlopCounterMode`` counts for the ops that
  actually run: matrix products (mm, addmm, bmm, baddbmm, einsum's products),
  convolutions and attention kernels, 2 FLOPs per multiply-add. Element-wise work
  (exp, softmax, masks, Hadamard products) is not counted, and neither is fused
  ``scaled_dot_product_attention`` on CPU, which the counter does not see.
* **Peak memory**: the high-water mark of bytes allocated through PyTorch's CPU
  allocator while the call runs, above the level at its start (the inputs and the
  parameters, allocated before, are not counted; the output is). It is read from
  ``torch.profiler``'s allocation events (``profile_memory=True``). It does not see
  memory that a library allocates on its own (MKL or oneDNN workspaces), Python
  objects, or what the C allocator keeps after a free, so the process's resident
  size can be larger. ``tracemalloc`` sees none of these tensor allocations.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "LoadMonitor",
    "Timing",
    "bench_device",
    "call_timer",
    "count_flops",
    "cuda_event_seconds",
    "machine_info",
    "matmul_flop_rate",
    "paired_ratio",
    "peak_allocated_bytes",
    "peak_memory_bytes",
    "quiet_stderr",
    "time_callable",
    "time_interleaved",
    "time_interleaved_samples",
    "wall_seconds",
]


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of one call: median, minimum, maximum and quartiles over
    ``repeats``."""

    median: float
    minimum: float
    maximum: float
    repeats: int
    first_quartile: float | None = None
    third_quartile: float | None = None

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summary(samples: list[float]) -> Timing:
    first, third = _quartiles(samples)
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples), first, third)


def _quartiles(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return samples[0], samples[0]
    quartiles = statistics.quantiles(samples, n=4, method="inclusive")
    return quartiles[0], quartiles[2]


def paired_ratio(samples: dict[str, list[float]], numerator: str, denominator: str) -> dict[str, float]:
    """The ratio of two callables' times per interleaved round (both measured under the
    same load), summarised by its median and quartiles: steadier than a ratio of medians
    when the load drifts during the run."""
    ratios = [a / b for a, b in zip(samples[numerator], samples[denominator], strict=True)]
    first, third = _quartiles(ratios)
    return {"median": statistics.median(ratios), "first_quartile": first, "third_quartile": third,
            "minimum": min(ratios), "maximum": max(ratios), "rounds": len(ratios)}


def time_callable(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5) -> Timing:
    """Median wall time of ``fn()`` over ``repeats`` calls, after ``warmup`` calls."""
    return time_interleaved({"fn": fn}, warmup=warmup, repeats=repeats)["fn"]


def time_interleaved(
    fns: dict[str, Callable[[], Any]], *, warmup: int = 1, repeats: int = 5
) -> dict[str, Timing]:
    """Time several callables in turns, so that load changes hit them alike."""
    samples = time_interleaved_samples(fns, warmup=warmup, repeats=repeats)
    return {name: summary(values) for name, values in samples.items()}


def time_interleaved_samples(
    fns: dict[str, Callable[[], Any]],
    *,
    warmup: int = 1,
    repeats: int = 5,
    timer: Callable[[Callable[[], Any]], float] | None = None,
) -> dict[str, list[float]]:
    """The raw seconds of :func:`time_interleaved`, one per round and callable, each
    measured by ``timer`` (default :func:`wall_seconds`; :func:`call_timer` picks the
    one for a device)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    timer = wall_seconds if timer is None else timer
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
    return samples


def wall_seconds(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn`` by ``time.perf_counter`` (the CPU timer)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cuda_event_seconds(fn: Callable[[], Any]) -> float:
    """Seconds of one call of ``fn`` on the current CUDA device, by two CUDA events.

    The device is synchronised first (nothing queued before counts), the events are
    recorded on the current stream before and after the call, and the end event is
    waited for: the time from the call's first kernel to its last, idle gaps included.
    """
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def call_timer(device: str | torch.device) -> Callable[[Callable[[], Any]], float]:
    """The timer of one call on ``device``: CUDA events on CUDA, ``perf_counter`` elsewhere."""
    return cuda_event_seconds if torch.device(device).type == "cuda" else wall_seconds


def bench_device(name: str | torch.device) -> torch.device:
    """``name`` as a device a benchmark can run on (``cpu``, ``cuda`` or ``cuda:N``);
    asking for CUDA where there is none is a clear error, not a crash deep inside."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"unknown device {name!r}: use cpu or cuda") from error
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {name!r}: the benchmarks run on cpu or cuda")
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"device {name!r}: CUDA is not available (torch {torch.__version__}, {built}, "
                         "no GPU visible); use --device cpu")
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of one call of ``fn`` as ``FlopCounterMode`` counts them (see the module doc)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def _event_nodes(nodes: list[Any]) -> Iterator[Any]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: the profiler's C++ side (Kineto) logs two
    lines per session there, which no setting turns off. Python exceptions still
    propagate; only what is written to the descriptor meanwhile is lost."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_allocated_bytes(fn: Callable[[], Any]) -> int | None:
    """Peak bytes allocated by PyTorch's CPU allocator during ``fn()`` (see the module
    doc), or None when this build of torch does not expose allocation events."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        fn()
    try:
        tree = profiler.profiler.kineto_results.experimental_event_tree()
        allocation = torch._C._profiler._EventType.Allocation
    except AttributeError:
        return None
    changes = sorted(
        (node.start_time_ns, node.extra_fields.alloc_size)
        for node in _event_nodes(tree)
        if node.tag == allocation and node.extra_fields.device.type == "cpu"
    )
    live = peak = 0
    for _, size in changes:
        live += size
        peak = max(peak, live)
    return peak


def peak_memory_bytes(fn: Callable[[], Any], device: str | torch.device) -> int | None:
    """Peak bytes allocated during ``fn()`` above the level at its start: on CUDA from
    the caching allocator's statistics (``torch.cuda.max_memory_allocated``), on the
    CPU from the profiler's allocation events (:func:`peak_allocated_bytes`)."""
    device = torch.device(device)
    if device.type != "cuda":
        return peak_allocated_bytes(fn)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def matmul_flop_rate(size: int = 2048, *, warmup: int = 1, repeats: int = 5) -> tuple[float, Timing]:
    """FLOP rate of a float32 ``size^3`` matrix product (2 size^3 FLOPs) and its timing."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    out = torch.empty(size, size)
    timing = time_callable(lambda: torch.mm(a, b, out=out), warmup=warmup, repeats=repeats)
    return 2 * size**3 / timing.median, timing


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: str | torch.device = "cpu") -> dict[str, Any]:
    """The machine and software a result was measured with (and the GPU, on CUDA)."""
    info = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if torch.device(device).type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info |= {"gpu": properties.name, "gpu_memory_bytes": properties.total_memory,
                 "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    return info


def _proc_stat() -> tuple[int, int, int] | None:
    """(busy, steal, total) jiffies of all CPUs from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat", encoding="utf-8") as file:
            fields = [int(value) for value in file.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


class LoadMonitor:
    """How busy the machine was during a ``with`` block, and how much of it was us.

    ``result()`` gives fractions of all CPUs' time: ``machine_busy`` (all processes),
    ``own`` (this process, all threads), ``others`` (the difference: what other
    processes took from us), ``steal`` (time the hypervisor gave to other guests) and
    the 1-minute load average at the end. Only available on Linux; elsewhere the
    fractions are None.
    """

    def __enter__(self) -> LoadMonitor:
        self._start = (time.perf_counter(), _own_cpu_seconds(), _proc_stat())
        self._result: dict[str, Any] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._start[0]
        own = _own_cpu_seconds() - self._start[1]
        stat_end, stat_start = _proc_stat(), self._start[2]
        cpus = os.cpu_count() or 1
        result: dict[str, Any] = {"seconds": wall, "cpus": cpus, "loadavg_1min": os.getloadavg()[0]}
        if stat_start is not None and stat_end is not None and stat_end[2] > stat_start[2]:
            total = stat_end[2] - stat_start[2]
            busy = (stat_end[0] - stat_start[0]) / total
            own_fraction = min(own / (wall * cpus), 1.0) if wall > 0 else 0.0
            result |= {
                "machine_busy": busy,
                "own": own_fraction,
                "others": max(busy - own_fraction, 0.0),
                "steal": (stat_end[1] - stat_start[1]) / total,
            }
        else:
            result |= dict.fromkeys(("machine_busy", "own", "others", "steal"))
        self._result = result

    def result(self) -> dict[str, Any]:
        return dict(self._result)


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
