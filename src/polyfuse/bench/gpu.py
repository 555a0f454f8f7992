"""``polyfuse bench gpu``: every registered fusion module by batch and length, eager and
compiled, float32 and bfloat16, forward and forward+backward, with peak memory; and the
length at which MAN's had mode gets faster than its exact mode.

**The grid.** Every module (:func:`polyfuse.nn.available`, or ``modules``) is built with
its registry defaults on three modalities of the CMU-MOSI feature sizes 300, 74 and 35
(BAN takes the first two), ``out_dim`` 64, all of length T, each other sample padded by
a quarter of its steps; modules that take ``max_lengths`` get T. At every (batch, T) and
precision the eager module and its compiled form (:func:`polyfuse.nn.compile`, which
keeps TFN's and LMF's LSTMs eager) run forward (``torch.no_grad``) and forward+backward
(the gradient of the output's sum with respect to the inputs and the weights), in eval
mode, timed in interleaved rounds (eager, compiled, eager, compiled, ...; CUDA events on
CUDA, see :func:`~polyfuse.bench.measure.call_timer`); the speed-up is the median over
rounds of eager / compiled. ``bf16`` runs the forward under ``torch.autocast`` with
bfloat16 (the backward outside it, as in training). **Peak memory** is what one call
allocates above the level at its start: ``torch.cuda.max_memory_allocated`` on CUDA, the
profiler's allocation events on the CPU (:func:`~polyfuse.bench.measure.peak_memory_bytes`).

A cell that fails (an exception, out of memory, a refused length) records its error as a
string and the run goes on. Every row is run eager first; compiling is the expensive part
and comes after, module by module (LMF, TFN, MAN and BAN first), each compiled point timed
in turns with eager again. ``compiled_grid="first"`` compiles at the first batch and length
only, and ``time_budget_s`` stops starting new rows or compiled points once spent (those
are listed as not run).

**The crossover.** MAN in its exact mode (the B x heads x T^m tuple tensor) and in had
mode (random features, linear in T), at the issue's sizes (batch 32, three modalities of
40 features, hidden size 40, 10 heads, 24 random features, 4 LSC chunks for had), over
``crossover_lengths``, forward and forward+backward, float32; exact runs only where its
predicted memory (:func:`polyfuse.bench.complexity.predicted_tensor_bytes`) is under
``exact_memory_bound``. The crossover is the first length at which had is faster than
exact after exact was faster at the length before it.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

import polyfuse.nn
from polyfuse.bench.complexity import predicted_tensor_bytes
from polyfuse.bench.measure import (
    bench_device,
    call_timer,
    paired_ratio,
    peak_memory_bytes,
    time_interleaved_samples,
)
from polyfuse.bench.results import format_bytes, result_header

__all__ = ["FULL", "QUICK", "GpuBenchSettings", "crossover_length", "gpu_markdown", "run_gpu_bench"]

DIMS = (300, 74, 35)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PASSES = ("forward", "forward_backward")
# LMF and TFN first: the modules whose compiled form lost to eager (docs/BENCHMARKS.md, "torch.compile"), then MAN and BAN.
ORDER = ("lmf", "tfn", "man", "ban")


@dataclass(frozen=True)
class GpuBenchSettings:
    """What ``polyfuse bench gpu`` runs (see the module docstring)."""

    device: str = "cuda"
    modules: tuple[str, ...] | None = None
    batch_sizes: tuple[int, ...] = (32, 256)
    lengths: tuple[int, ...] = (50, 200)
    precisions: tuple[str, ...] = ("fp32", "bf16")
    compiled: bool = True
    compiled_grid: str = "all"  # "all" or "first" (the first batch and length only)
    compile_mode: str | None = None  # torch.compile mode; None: the default mode
    backend: str = "inductor"
    repeats: int = 20
    warmup: int = 3
    memory: bool = True
    out_dim: int = 64
    crossover_lengths: tuple[int, ...] = (25, 50, 100, 200, 400, 800, 1600)
    crossover_batch: int = 32
    crossover_dim: int = 40
    crossover_heads: int = 10
    crossover_random_features: int = 24
    exact_memory_bound: int | None = None  # bytes; None: 80% of the GPU's memory, 1 GiB on the CPU
    time_budget_s: float | None = None
    seed: int = 0


FULL = GpuBenchSettings()
#: Tiny sizes that exercise every path on the CPU in seconds (not a measurement).
QUICK = GpuBenchSettings(device="cpu", batch_sizes=(2,), lengths=(3,), repeats=2, warmup=0,
                         crossover_lengths=(2, 4), crossover_batch=2, crossover_dim=4, crossover_heads=2,
                         crossover_random_features=4, compiled_grid="first", backend="eager")


# ---------------------------------------------------------------------------
# One call of a module
# ---------------------------------------------------------------------------


def _inputs(dims: Sequence[int], batch: int, length: int, device: torch.device, seed: int
            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, length, d, generator=generator).to(device) for d in dims]
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[::2, length - length // 4:] = False  # every other sample padded by a quarter
    return inputs, [mask.to(device)] * len(dims)


def _autocast(device: torch.device, precision: str) -> Any:
    dtype = PRECISIONS[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def _step(module: Callable[..., Any], inputs: list[torch.Tensor], masks: list[torch.Tensor], *, backward: bool,
          device: torch.device, precision: str, new_step: bool = False) -> Callable[[], Any]:
    """One forward (no_grad) or forward+backward call, under the precision's autocast."""
    def call() -> Any:
        if new_step:  # CUDA graphs: the previous call's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        if not backward:
            with torch.no_grad(), _autocast(device, precision):
                return module(inputs, masks)
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        with _autocast(device, precision):
            output = module(leaves, masks)
        output.float().sum().backward()
        return output
    return call


def _error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first[:300]


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _time_cells(calls: dict[str, Callable[[], Any]], settings: GpuBenchSettings, device: torch.device
                ) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]]]:
    """Run each call once (an error is its cell's result; for a compiled call this first
    run compiles it), time the rest in interleaved rounds, then measure peak memory."""
    cells: dict[str, dict[str, Any]] = {}
    working: dict[str, Callable[[], Any]] = {}
    for name, call in calls.items():
        start = time.perf_counter()
        try:
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as error:  # any failure is recorded, the others go on
            cells[name] = {"error": _error(error)}
            _release(device)
            continue
        cells[name] = {"first_call_s": time.perf_counter() - start}
        working[name] = call
    samples: dict[str, list[float]] = {}
    if working:
        try:
            samples = time_interleaved_samples(working, warmup=settings.warmup, repeats=settings.repeats,
                                               timer=call_timer(device))
        except Exception as error:
            for name in working:
                cells[name] = {"error": _error(error)}
            _release(device)
            return cells, {}
    for name, values in samples.items():
        quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
        first, third = quartiles[0], quartiles[2]
        cells[name] |= {"median_ms": 1e3 * statistics.median(values), "first_quartile_ms": 1e3 * first,
                        "third_quartile_ms": 1e3 * third}
        if settings.memory:
            try:
                cells[name]["peak_bytes"] = peak_memory_bytes(working[name], device)
            except Exception as error:
                cells[name]["peak_bytes_error"] = _error(error)
    return cells, samples


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------


def _build(name: str, length: int, settings: GpuBenchSettings, device: torch.device) -> tuple[torch.nn.Module, int]:
    cls = polyfuse.nn.get(name)
    count = 2 if cls.max_modalities == 2 else 3
    options = {"max_lengths": length} if "max_lengths" in inspect.signature(cls.__init__).parameters else {}
    torch.manual_seed(settings.seed)
    module = polyfuse.nn.create(name, input_dims=list(DIMS[:count]), out_dim=settings.out_dim, **options)
    return module.to(device).eval(), count


def _grid_row(name: str, batch: int, length: int, precision: str, compiled: Any, module: torch.nn.Module,
              count: int, settings: GpuBenchSettings, device: torch.device) -> dict[str, Any]:
    row: dict[str, Any] = {"module": name, "batch": batch, "length": length, "precision": precision}
    inputs, masks = _inputs(DIMS[:count], batch, length, device, settings.seed)
    new_step = settings.compile_mode == "reduce-overhead"
    calls = {}
    for backward, pass_name in ((False, "forward"), (True, "forward_backward")):
        calls[f"eager/{pass_name}"] = _step(module, inputs, masks, backward=backward, device=device, precision=precision)
        if compiled is not None:
            calls[f"compiled/{pass_name}"] = _step(compiled, inputs, masks, backward=backward, device=device,
                                                   precision=precision, new_step=new_step)
    cells, samples = _time_cells(calls, settings, device)
    row["cells"] = cells
    row["speedup"] = {pass_name: paired_ratio(samples, f"eager/{pass_name}", f"compiled/{pass_name}")
                      for pass_name in PASSES
                      if f"eager/{pass_name}" in samples and f"compiled/{pass_name}" in samples}
    if compiled is not None and "eager/forward" in samples and "compiled/forward" in samples:
        with torch.no_grad(), _autocast(device, precision):
            eager_out = module(inputs, masks).float()
            if new_step:
                torch.compiler.cudagraph_mark_step_begin()
            compiled_out = compiled(inputs, masks).float()
        row["max_abs_difference"] = float((eager_out - compiled_out).abs().max())
    return row


def _over_budget(settings: GpuBenchSettings, started: float) -> str | None:
    if settings.time_budget_s is not None and time.perf_counter() - started > settings.time_budget_s:
        return f"time budget of {settings.time_budget_s:.0f} s spent"
    return None


def _grid(settings: GpuBenchSettings, device: torch.device, started: float,
          progress: Callable[[str], None] | None) -> list[dict[str, Any]]:
    """Every row eager first (cheap), then the compiled cells module by module (the modules
    whose compiled form lost to eager first), each compiled point timed in turns with eager
    again (its row's eager cells are replaced by those of the pair)."""
    names = list(polyfuse.nn.available() if settings.modules is None else settings.modules)
    for name in names:
        polyfuse.nn.get(name)  # an unknown name lists the known ones, before anything runs
    rows: dict[tuple[str, int, int, str], dict[str, Any]] = {}
    for name in names:
        for length in settings.lengths:
            try:
                module, count = _build(name, length, settings, device)
            except Exception as error:
                module, count, built = None, 0, _error(error)
            for batch in settings.batch_sizes:
                for precision in settings.precisions:
                    key = (name, batch, length, precision)
                    head = {"module": name, "batch": batch, "length": length, "precision": precision}
                    if module is None:
                        rows[key] = head | {"error": built}
                    elif reason := _over_budget(settings, started):
                        rows[key] = head | {"not_run": reason}
                    else:
                        rows[key] = _grid_row(name, batch, length, precision, None, module, count, settings, device)
                        _release(device)
                        if progress is not None:
                            progress(_row_line(rows[key]))
            del module
            _release(device)
    if settings.compiled:
        _compiled_cells(rows, names, settings, device, started, progress)
    return list(rows.values())


def _recompile_limit(limit: int) -> Any:
    """Dynamo's recompile limit raised to ``limit``, and hitting it an error: a compiled form
    that falls back to eager must not be timed as compiled. (Named ``cache_size_limit``
    before torch 2.6.)"""
    config = torch._dynamo.config
    if hasattr(config, "recompile_limit") and hasattr(config, "fail_on_recompile_limit_hit"):
        return config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True)
    return config.patch(cache_size_limit=limit, fail_on_cache_limit_hit=True)


def _compiled_cells(rows: dict[tuple[str, int, int, str], dict[str, Any]], names: list[str],
                    settings: GpuBenchSettings, device: torch.device, started: float,
                    progress: Callable[[str], None] | None) -> None:
    first_point = (settings.batch_sizes[0], settings.lengths[0])
    order = [name for name in ORDER if name in names] + [name for name in names if name not in ORDER]
    options = {"backend": settings.backend} | ({"mode": settings.compile_mode} if settings.compile_mode else {})
    with _recompile_limit(64):
        for name in order:
            torch._dynamo.reset()
            for length in settings.lengths:
                points = [(batch, precision) for batch in settings.batch_sizes for precision in settings.precisions
                          if (settings.compiled_grid == "all" or (batch, length) == first_point)
                          and "cells" in rows[name, batch, length, precision]]
                if not points:
                    continue
                module, count = _build(name, length, settings, device)
                compiled_form = polyfuse.nn.compile(module, **options)
                for batch, precision in points:
                    row = rows[name, batch, length, precision]
                    if reason := _over_budget(settings, started):
                        row["compiled_not_run"] = reason
                        continue
                    row |= _grid_row(name, batch, length, precision, compiled_form, module, count, settings, device)
                    _release(device)
                    if progress is not None:
                        progress(_row_line(row))
                del module, compiled_form
                _release(device)


def _row_line(row: dict[str, Any]) -> str:
    head = f"{row['module']} batch {row['batch']} T {row['length']} {row['precision']}"
    parts = []
    for key, cell in row.get("cells", {}).items():
        parts.append(f"{key} {cell['error'][:60]}" if "error" in cell else f"{key} {cell['median_ms']:.2f} ms")
    return f"{head}: " + "; ".join(parts)


# ---------------------------------------------------------------------------
# The exact / had crossover of MAN
# ---------------------------------------------------------------------------


def crossover_length(lengths: Sequence[int], exact_ms: Sequence[float | None], had_ms: Sequence[float | None]
                     ) -> dict[str, Any]:
    """The first length at which had is faster than exact, where exact was faster at the
    length before it (None where a mode did not run). Returns ``{"length": T or None,
    "reading": text}``."""
    both = [(t, e, h) for t, e, h in zip(lengths, exact_ms, had_ms, strict=True) if e is not None and h is not None]
    if not both:
        return {"length": None, "reading": "no length where both modes ran"}
    for (_, e0, h0), (t1, e1, h1) in itertools.pairwise(both):
        if e0 <= h0 and h1 < e1:
            return {"length": t1, "reading": f"had faster than exact from T = {t1}"}
    if all(h < e for _, e, h in both):
        return {"length": None, "reading": f"had faster at every length where both ran (from T = {both[0][0]})"}
    if all(e <= h for _, e, h in both):
        return {"length": None, "reading": f"exact faster up to T = {both[-1][0]}, the longest it ran"}
    return {"length": None, "reading": "no single crossover (the order changes more than once)"}


def _memory_bound(settings: GpuBenchSettings, device: torch.device) -> int:
    if settings.exact_memory_bound is not None:
        return settings.exact_memory_bound
    if device.type == "cuda":
        return int(0.8 * torch.cuda.get_device_properties(device).total_memory)
    return 2**30


def _crossover(settings: GpuBenchSettings, device: torch.device,
               progress: Callable[[str], None] | None) -> dict[str, Any]:
    size, heads, batch = settings.crossover_dim, settings.crossover_heads, settings.crossover_batch
    bound = _memory_bound(settings, device)
    points = []
    for length in settings.crossover_lengths:
        point: dict[str, Any] = {"length": length}
        inputs, masks = _inputs([size] * 3, batch, length, device, settings.seed)
        calls = {}
        for mode in ("exact", "had"):
            needed = predicted_tensor_bytes(modalities=3, length=length, batch=batch, heads=heads,
                                            head_dim=size // heads, backward=True)
            if mode == "exact" and needed > bound:
                point[mode] = {"not_run": f"would need about {format_bytes(needed)}, above the bound of "
                                          f"{format_bytes(bound)}"}
                continue
            torch.manual_seed(settings.seed)
            try:
                module = polyfuse.nn.create(
                    "man", input_dims=[size] * 3, out_dim=size, hidden_dim=size, heads=heads,
                    num_random_features=settings.crossover_random_features, mode=mode,
                    chunks=4 if mode == "had" else 0, seed=settings.seed).to(device).eval()
            except Exception as error:
                point[mode] = {"error": _error(error)}
                continue
            for backward, pass_name in ((False, "forward"), (True, "forward_backward")):
                calls[f"{mode}/{pass_name}"] = _step(module, inputs, masks, backward=backward, device=device,
                                                     precision="fp32")
        cells, _ = _time_cells(calls, settings, device)
        for mode in ("exact", "had"):
            if mode not in point:
                point[mode] = {pass_name: cells[f"{mode}/{pass_name}"] for pass_name in PASSES}
        points.append(point)
        _release(device)
        if progress is not None:
            progress(f"crossover T {length}: " + "; ".join(
                f"{key} {cell.get('median_ms', float('nan')):.2f} ms" for key, cell in cells.items()))
    result: dict[str, Any] = {"points": points, "exact_memory_bound": bound,
                              "sizes": {"batch": batch, "modalities": 3, "features": size, "hidden_dim": size,
                                        "heads": heads, "random_features": settings.crossover_random_features,
                                        "had_chunks": 4}}
    for pass_name in PASSES:
        def median(point: dict[str, Any], mode: str, pass_name: str = pass_name) -> float | None:
            cell = point[mode].get(pass_name)
            return cell.get("median_ms") if isinstance(cell, dict) else None
        result[pass_name] = crossover_length([p["length"] for p in points], [median(p, "exact") for p in points],
                                             [median(p, "had") for p in points])
    return result


# ---------------------------------------------------------------------------
# The whole run and its report
# ---------------------------------------------------------------------------


def run_gpu_bench(settings: GpuBenchSettings = FULL, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the crossover, then the grid (see the module docstring); returns the JSON payload."""
    device = bench_device(settings.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    for precision in settings.precisions:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if settings.compiled_grid not in ("all", "first"):
        raise ValueError(f"compiled_grid must be 'all' or 'first', got {settings.compiled_grid!r}")
    if not settings.batch_sizes or not settings.lengths or min(settings.batch_sizes + settings.lengths) < 1:
        raise ValueError("batch sizes and lengths must be non-empty and positive")
    started = time.perf_counter()
    crossover = _crossover(settings, device, progress) if settings.crossover_lengths else None
    rows = _grid(settings, device, started, progress)
    recorded = asdict(settings) | {"device": str(device), "dims": DIMS,
                                   "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                                   "memory": ("torch.cuda.max_memory_allocated" if device.type == "cuda"
                                              else "CPU allocator, profiler events") if settings.memory else None,
                                   "seconds": time.perf_counter() - started}
    return {**result_header("gpu", recorded, device), "crossover": crossover, "rows": rows}


def _cell_text(cell: dict[str, Any] | None, memory: bool) -> str:
    if cell is None:
        return "-"
    if "error" in cell:
        return f"error: {cell['error'][:80]}"
    text = f"{cell['median_ms']:.2f}"
    if memory and "peak_bytes" in cell:
        text += f" / {format_bytes(cell['peak_bytes'])}"
    return text


def _speedup_text(row: dict[str, Any], pass_name: str) -> str:
    ratio = row.get("speedup", {}).get(pass_name)
    return "-" if ratio is None else f"{ratio['median']:.2f}"


def gpu_markdown(payload: dict[str, Any], command: str) -> str:
    """The report of one run (written as ``gpu.md`` beside ``gpu.json``)."""
    settings, machine = payload["settings"], payload["machine"]
    on_gpu = settings["device"].startswith("cuda")
    where = (f"{machine['gpu']} ({machine['gpu_memory_bytes'] / 2**30:.0f} GiB, CUDA {machine.get('cuda')})"
             if on_gpu else f"the CPU ({machine['cpu']}, {machine['torch_threads']} threads): not a GPU measurement")
    memory = settings["memory"] is not None
    lines = [f"## Every module on {'the GPU' if on_gpu else 'the CPU'}: eager and compiled, fp32 and bf16", "",
             f"`{command}` on {where}; torch {machine['torch']}, measured {payload['created']} "
             f"(polyfuse {payload['polyfuse']}), {settings['seconds']:.0f} s.", "",
             f"Registry defaults on inputs of sizes {'/'.join(map(str, settings['dims']))} (BAN the first two), "
             f"out_dim {settings['out_dim']}, every other sample padded by a quarter, eval mode. Each cell: "
             f"median ms over {settings['repeats']} interleaved rounds after {settings['warmup']} warm-up "
             f"({settings['timer']})" + (f" / peak memory above the start ({settings['memory']})" if memory else "")
             + f". Compiled: `polyfuse.nn.compile(module, backend={settings['backend']!r}"
             + (f", mode={settings['compile_mode']!r}" if settings["compile_mode"] else "")
             + ")`" + (" at the first batch and length only" if settings["compiled_grid"] == "first" else "")
             + "; speed-up = eager / compiled, median over rounds. bf16: the forward under `torch.autocast`.", ""]
    if payload.get("crossover"):
        lines += _crossover_lines(payload["crossover"], memory)
    lines += ["| module | batch | T | precision | eager fwd | compiled fwd | speed-up fwd | eager fwd+bwd "
              "| compiled fwd+bwd | speed-up fwd+bwd |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in payload["rows"]:
        head = f"| {row['module']} | {row['batch']} | {row['length']} | {row['precision']} |"
        if "error" in row or "not_run" in row:
            lines.append(f"{head} {row.get('error') or 'not run: ' + row['not_run']} | | | | | |")
            continue
        cells = row["cells"]
        skipped = "not run: budget" if "compiled_not_run" in row else None
        lines.append(f"{head} {_cell_text(cells.get('eager/forward'), memory)} "
                     f"| {skipped or _cell_text(cells.get('compiled/forward'), memory)} | {_speedup_text(row, 'forward')} "
                     f"| {_cell_text(cells.get('eager/forward_backward'), memory)} "
                     f"| {skipped or _cell_text(cells.get('compiled/forward_backward'), memory)} "
                     f"| {_speedup_text(row, 'forward_backward')} |")
    return "\n".join(lines).rstrip() + "\n"


def _crossover_lines(crossover: dict[str, Any], memory: bool) -> list[str]:
    sizes = crossover["sizes"]
    lines = [f"**MAN exact against had** (batch {sizes['batch']}, 3 modalities of {sizes['features']}, "
             f"hidden {sizes['hidden_dim']}, {sizes['heads']} heads, H = {sizes['random_features']}, had with "
             f"{sizes['had_chunks']} LSC chunks, float32; exact only under "
             f"{format_bytes(crossover['exact_memory_bound'])} predicted): forward: "
             f"{crossover['forward']['reading']}; forward+backward: {crossover['forward_backward']['reading']}.", "",
             "| T | exact fwd | had fwd | exact fwd+bwd | had fwd+bwd |", "|---:|---:|---:|---:|---:|"]
    for point in crossover["points"]:
        cells = []
        for pass_name in PASSES:
            for mode in ("exact", "had"):
                cell = point[mode]
                if "not_run" in cell or "error" in cell:
                    cells.append(f"not run ({cell['not_run']})" if "not_run" in cell else f"error: {cell['error'][:80]}")
                else:
                    cells.append(_cell_text(cell.get(pass_name), memory))
        lines.append(f"| {point['length']} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return [*lines, ""]
