"""``polyfuse bench compile``: eager vs ``torch.compile`` time of every registered fusion.

Each module is built with its defaults at one size (batch 32, three modalities of
lengths 20, 30, 25 and sizes 64, 48, 32; BAN takes the first two), in float32, eval
mode (``training=True``: train mode) on ``device``, and compiled as polyfuse
recommends (:func:`polyfuse.nn.compile`: ``fullgraph=True`` for every module but TFN
and LMF, whose text LSTM runs eagerly between graphs) with ``mode`` (None: the default
mode; ``"reduce-overhead"``: CUDA graphs on CUDA, the default mode on the CPU).
Forward (``torch.no_grad``) and forward+backward (gradient of the output's sum with
respect to the inputs and weights) are timed in turns against the eager module (see
:func:`~polyfuse.bench.measure.time_interleaved_samples`; CUDA events on CUDA), after a
first call that compiles; the compile time is that first call's. The speed-up is the
median over rounds of eager / compiled. Outputs are checked equal (float32 tolerance)
before anything is timed. Each row records how many graphs were compiled and, for
``reduce-overhead``, how many CUDA-graph recordings inductor skipped (all of them on
the CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import polyfuse.nn
from polyfuse.bench.measure import bench_device, call_timer, paired_ratio, time_interleaved_samples
from polyfuse.bench.results import result_header

__all__ = ["run_compile_bench"]

LENGTHS = (20, 30, 25)
DIMS = (64, 48, 32)
# LMF and TFN first: the modules whose compiled form lost to eager (docs/BENCHMARKS.md, "torch.compile").
ORDER = ("lmf", "tfn", "man", "ban")


def _inputs(count: int, batch: int, generator: torch.Generator, device: torch.device
            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    inputs = [torch.randn(batch, t, d, generator=generator).to(device)
              for t, d in zip(LENGTHS[:count], DIMS[:count], strict=True)]
    masks = []
    for t in LENGTHS[:count]:
        mask = torch.ones(batch, t, dtype=torch.bool)
        mask[::2, t - t // 4:] = False  # every other sample padded by a quarter
        masks.append(mask.to(device))
    return inputs, masks


def _forward(module: Callable[..., Any], inputs: list[torch.Tensor], masks: list[torch.Tensor],
             new_step: bool = False) -> Callable[[], Any]:
    def step() -> None:
        if new_step:  # CUDA graphs: the previous call's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            module(inputs, masks)
    return step


def _forward_backward(module: Callable[..., Any], inputs: list[torch.Tensor], masks: list[torch.Tensor],
                      new_step: bool = False) -> Callable[[], Any]:
    def step() -> None:
        if new_step:
            torch.compiler.cudagraph_mark_step_begin()
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        module(leaves, masks).sum().backward()
    return step


def ordered_modules(names: Sequence[str] | None) -> list[str]:
    """``names`` (default: every registered module, LMF, TFN, MAN and BAN first), each
    checked against the registry."""
    if names:
        for name in names:
            polyfuse.nn.get(name)  # an unknown name lists the known ones
        return list(names)
    available = polyfuse.nn.available()
    return [name for name in ORDER if name in available] + [name for name in available if name not in ORDER]


def run_compile_bench(
    names: Sequence[str] | None = None,
    *,
    batch: int = 32,
    repeats: int = 15,
    warmup: int = 2,
    backend: str = "inductor",
    mode: str | None = None,
    device: str | torch.device = "cpu",
    training: bool = False,
    time_budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time every module (or ``names``) eager and compiled with ``backend`` and ``mode``;
    see the module docstring. Once ``time_budget_s`` seconds are spent no new module is
    started (the rest are listed as not run)."""
    device = bench_device(device)
    timer = call_timer(device)
    names = ordered_modules(names)
    new_step = mode == "reduce-overhead"
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for name in names:
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s:
            rows.append({"module": name, "not_run": f"time budget of {time_budget_s:.0f} s spent"})
            continue
        cls = polyfuse.nn.get(name)
        count = 2 if cls.max_modalities == 2 else 3
        torch.manual_seed(0)
        module = polyfuse.nn.create(name, input_dims=list(DIMS[:count]), out_dim=32).to(device)
        module.train(training)
        inputs, masks = _inputs(count, batch, torch.Generator().manual_seed(0), device)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        options = {"backend": backend} if mode is None else {"backend": backend, "mode": mode}
        compiled = polyfuse.nn.compile(module, **options)
        start = time.perf_counter()
        with torch.no_grad():
            torch.manual_seed(1)
            reference = module(inputs, masks)
            torch.manual_seed(1)
            output = compiled(inputs, masks).clone()
        compile_forward = time.perf_counter() - start
        difference = float((output - reference).abs().max())
        if not training:  # dropout draws differ between eager and compiled code
            torch.testing.assert_close(output, reference, rtol=1e-4, atol=1e-4)
        start = time.perf_counter()
        _forward_backward(compiled, inputs, masks, new_step)()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compile_backward = time.perf_counter() - start
        counters = torch._dynamo.utils.counters

        samples = time_interleaved_samples(
            {"eager": _forward(module, inputs, masks), "compiled": _forward(compiled, inputs, masks, new_step),
             "eager_fb": _forward_backward(module, inputs, masks),
             "compiled_fb": _forward_backward(compiled, inputs, masks, new_step)},
            warmup=warmup, repeats=repeats, timer=timer,
        )
        row = {
            "module": name,
            "fullgraph": polyfuse.nn.traces_as_one_graph(module),
            "graphs": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
            "max_abs_difference": difference,
            "compile_seconds": compile_forward + compile_backward,
            "eager_forward_ms": 1e3 * sorted(samples["eager"])[len(samples["eager"]) // 2],
            "speedup_forward": paired_ratio(samples, "eager", "compiled"),
            "speedup_forward_backward": paired_ratio(samples, "eager_fb", "compiled_fb"),
        }
        rows.append(row)
        if progress:
            progress(f"{name}: forward x{row['speedup_forward']['median']:.2f}, "
                     f"forward+backward x{row['speedup_forward_backward']['median']:.2f}, "
                     f"{row['graphs']} graph(s), compiled in {row['compile_seconds']:.0f} s")
    settings = {"backend": backend, "mode": mode or "default", "device": str(device), "training": training,
                "batch": batch, "lengths": LENGTHS, "dims": DIMS, "repeats": repeats, "warmup": warmup,
                "threads": torch.get_num_threads(), "torch": torch.__version__, "time_budget_s": time_budget_s,
                "timer": "cuda events" if device.type == "cuda" else "perf_counter"}
    return {**result_header("compile", settings, device), "rows": rows, "table": _table(rows)}


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| module | one graph | graphs compiled | eager forward (ms) | compiled speed-up, forward "
             "| forward+backward | compile (s) |",
             "|---|---|---:|---:|---|---|---:|"]
    for row in rows:
        if "not_run" in row:
            lines.append(f"| {row['module']} | not run: {row['not_run']} | | | | | |")
            continue
        f, fb = row["speedup_forward"], row["speedup_forward_backward"]
        lines.append(
            f"| {row['module']} | {'yes' if row['fullgraph'] else 'no (LSTM eager)'} | {row['graphs']} "
            f"| {row['eager_forward_ms']:.2f} "
            f"| {f['median']:.2f} ({f['first_quartile']:.2f}-{f['third_quartile']:.2f}) "
            f"| {fb['median']:.2f} ({fb['first_quartile']:.2f}-{fb['third_quartile']:.2f}) | {row['compile_seconds']:.0f} |"
        )
    return "\n".join(lines)
