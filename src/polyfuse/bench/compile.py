"""``polyfuse bench compile``: eager vs ``torch.compile`` time of every registered fusion.

Each module is built with its defaults at one size (batch 32, three modalities of
lengths 20, 30, 25 and sizes 64, 48, 32; BAN takes the first two), in float32 and eval
mode, and compiled with ``torch.compile(fullgraph=True)`` (the inductor backend).
Forward (``torch.no_grad``) and forward+backward (gradient of the output's sum with
respect to the inputs and weights) are timed in turns against the eager module (see
:func:`~polyfuse.bench.measure.time_interleaved_samples`), after a first call that
compiles; the compile time is that first call's. The speed-up is the median over
rounds of eager / compiled. Outputs are checked equal (float32 tolerance) before
anything is timed. TFN and LMF read text with an LSTM, which dynamo traces only with
``torch._dynamo.config.allow_rnn``; it is set for the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import polyfuse.nn
from polyfuse.bench.measure import paired_ratio, time_interleaved_samples
from polyfuse.bench.results import result_header

__all__ = ["run_compile_bench"]

LENGTHS = (20, 30, 25)
DIMS = (64, 48, 32)


def _inputs(count: int, batch: int, generator: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    inputs = [torch.randn(batch, t, d, generator=generator) for t, d in zip(LENGTHS[:count], DIMS[:count], strict=True)]
    masks = []
    for t in LENGTHS[:count]:
        mask = torch.ones(batch, t, dtype=torch.bool)
        mask[::2, t - t // 4:] = False  # every other sample padded by a quarter
        masks.append(mask)
    return inputs, masks


def _forward(module: torch.nn.Module, inputs: list[torch.Tensor], masks: list[torch.Tensor]) -> Callable[[], Any]:
    def step() -> None:
        with torch.no_grad():
            module(inputs, masks)
    return step


def _forward_backward(module: torch.nn.Module, inputs: list[torch.Tensor], masks: list[torch.Tensor]) -> Callable[[], Any]:
    def step() -> None:
        leaves = [x.detach().requires_grad_(True) for x in inputs]
        module(leaves, masks).sum().backward()
    return step


def run_compile_bench(
    names: Sequence[str] | None = None,
    *,
    batch: int = 32,
    repeats: int = 15,
    warmup: int = 2,
    backend: str = "inductor",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time every module (or ``names``) eager and compiled with ``backend``; see the
    module docstring."""
    names = list(names or polyfuse.nn.available())
    rows = []
    with torch._dynamo.config.patch(allow_rnn=True):
        for name in names:
            cls = polyfuse.nn.get(name)
            count = 2 if cls.max_modalities == 2 else 3
            torch.manual_seed(0)
            module = polyfuse.nn.create(name, input_dims=list(DIMS[:count]), out_dim=32).eval()
            inputs, masks = _inputs(count, batch, torch.Generator().manual_seed(0))
            torch._dynamo.reset()
            compiled = torch.compile(module, fullgraph=True, backend=backend)
            start = time.perf_counter()
            with torch.no_grad():
                reference, output = module(inputs, masks), compiled(inputs, masks)
            compile_forward = time.perf_counter() - start
            difference = float((output - reference).abs().max())
            torch.testing.assert_close(output, reference, rtol=1e-4, atol=1e-4)
            start = time.perf_counter()
            _forward_backward(compiled, inputs, masks)()
            compile_backward = time.perf_counter() - start

            samples = time_interleaved_samples(
                {"eager": _forward(module, inputs, masks), "compiled": _forward(compiled, inputs, masks),
                 "eager_fb": _forward_backward(module, inputs, masks),
                 "compiled_fb": _forward_backward(compiled, inputs, masks)},
                warmup=warmup, repeats=repeats,
            )
            row = {
                "module": name,
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
                         f"compiled in {row['compile_seconds']:.0f} s")
    settings = {"backend": backend, "batch": batch, "lengths": LENGTHS, "dims": DIMS, "repeats": repeats, "warmup": warmup,
                "threads": torch.get_num_threads(), "torch": torch.__version__}
    return {**result_header("compile", settings), "rows": rows, "table": _table(rows)}


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| module | eager forward (ms) | compiled speed-up, forward | forward+backward | compile (s) |",
             "|---|---|---|---|---|"]
    for row in rows:
        f, fb = row["speedup_forward"], row["speedup_forward_backward"]
        lines.append(
            f"| {row['module']} | {row['eager_forward_ms']:.2f} | {f['median']:.2f} ({f['first_quartile']:.2f}-{f['third_quartile']:.2f}) "
            f"| {fb['median']:.2f} ({fb['first_quartile']:.2f}-{fb['third_quartile']:.2f}) | {row['compile_seconds']:.0f} |"
        )
    return "\n".join(lines)
