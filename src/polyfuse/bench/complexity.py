"""``polyfuse bench complexity``: cost against the number of modalities, the lengths,
the random features and the batch size, for MAN (exact, hadamard, had) and baselines.

Every point builds the module with :func:`polyfuse.nn.create` on m modalities of
feature size ``hidden_dim`` and length T (no padding), and measures FLOPs, forward
time (``torch.no_grad``, eval mode), forward + backward time (a sum of the output,
gradients of all parameters) and the peak memory of the forward pass (see
:mod:`polyfuse.bench.measure` for what each means). MAN's exact and hadamard modes
build a tensor of B G prod_j T_j entries (batch, heads, tuples of steps); a point
whose predicted memory is above ``exact_memory_bound`` is recorded as not run, with
the prediction, and never extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from polyfuse.bench.measure import (
    LoadMonitor,
    count_flops,
    peak_allocated_bytes,
    time_interleaved,
)
from polyfuse.bench.results import format_bytes, result_header
from polyfuse.nn.registry import create

__all__ = [
    "FULL",
    "MODELS",
    "QUICK",
    "ComplexitySettings",
    "geometric_growth",
    "predicted_tensor_bytes",
    "run_complexity",
]

MODELS = ("man-exact", "man-hadamard", "man-had", "ban", "tfn", "lmf")
_TENSOR_MODES = {"man-exact": "exact", "man-hadamard": "hadamard"}
SWEEPS = ("modalities", "length", "random_features", "batch")


@dataclass(frozen=True)
class ComplexitySettings:
    """The grids and the fixed values of the other axes (the MOSI configuration of MAN:
    hidden size 40, 10 heads, 24 random features, 4 LSC chunks)."""

    modalities: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    lengths: tuple[int, ...] = (10, 20, 50, 100, 200, 400)
    random_features: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    batch_sizes: tuple[int, ...] = (1, 8, 32, 128)
    models: tuple[str, ...] = MODELS
    base_modalities: int = 3
    base_length: int = 50
    base_random_features: int = 24
    base_batch: int = 32
    hidden_dim: int = 40
    heads: int = 10
    chunks: int = 4
    warmup: int = 1
    repeats: int = 3
    exact_memory_bound: int = 2 * 2**30
    backward: bool = True
    memory: bool = True
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = ComplexitySettings()
QUICK = ComplexitySettings(
    modalities=(2, 3, 4),
    lengths=(10, 20, 40),
    random_features=(16, 64),
    batch_sizes=(2, 8),
    base_length=20,
    base_random_features=16,
    base_batch=4,
    hidden_dim=16,
    heads=2,
    warmup=0,
    repeats=1,
    exact_memory_bound=64 * 2**20,
)


def predicted_tensor_bytes(
    *, modalities: int, length: int, batch: int, heads: int, head_dim: int,
    backward: bool, itemsize: int = 4,
) -> int:
    """Memory MAN's exact and hadamard modes need for their tuple tensor of
    N = B G T^m entries: about 4 N (logits, mask, softmax, attention) plus the first
    contraction with the values, N K / T, for the forward pass; 5 N + 3 N K / T with
    the backward pass. Calibrated on measured peaks (it over-estimates them by 0 to
    30% on the sizes where it matters) and meant as a bound, not a prediction of
    the measurement."""
    entries = batch * heads * length**modalities
    ratio = head_dim / length
    factor = 5 + 3 * ratio if backward else 4 + 2 * ratio
    return int(itemsize * entries * factor)


@dataclass(frozen=True)
class _Point:
    sweep: str
    modalities: int
    length: int
    random_features: int
    batch: int


def _points(settings: ComplexitySettings) -> list[_Point]:
    base = _Point("", settings.base_modalities, settings.base_length,
                  settings.base_random_features, settings.base_batch)
    points = [replace(base, sweep="modalities", modalities=m) for m in settings.modalities]
    points += [replace(base, sweep="length", length=t) for t in settings.lengths]
    points += [replace(base, sweep="random_features", random_features=h)
               for h in settings.random_features]
    points += [replace(base, sweep="batch", batch=b) for b in settings.batch_sizes]
    return points


def _build(model: str, point: _Point, settings: ComplexitySettings) -> nn.Module:
    dims = [settings.hidden_dim] * point.modalities
    size = settings.hidden_dim
    if model.startswith("man-"):
        mode = model.removeprefix("man-")
        return create(
            "man", input_dims=dims, out_dim=size, hidden_dim=size, heads=settings.heads,
            num_random_features=point.random_features, mode=mode,
            chunks=0 if mode == "hadamard" else settings.chunks, seed=settings.seed,
        )
    if model == "ban":
        return create("ban", input_dims=dims, out_dim=size, hidden_dim=size)
    # TFN and LMF: the fusion layer's cost (the papers' subnetworks are not fusion)
    return create(model, input_dims=dims, out_dim=size, subnetworks="light")


def _skip_reason(model: str, point: _Point, settings: ComplexitySettings) -> tuple[str, int | None] | None:
    if model == "ban" and point.modalities != 2:
        return "not applicable (BAN takes exactly 2 modalities)", None
    if model in _TENSOR_MODES:
        needed = predicted_tensor_bytes(
            modalities=point.modalities, length=point.length, batch=point.batch,
            heads=settings.heads, head_dim=settings.hidden_dim // settings.heads,
            backward=settings.backward,
        )
        if needed > settings.exact_memory_bound:
            return (
                f"not run (would need about {format_bytes(needed)} for the "
                f"{point.batch}x{settings.heads}x{point.length}^{point.modalities} tuple tensor, "
                f"above the bound of {format_bytes(settings.exact_memory_bound)})",
                needed,
            )
        return None
    return None


def measure_point(model: str, point: _Point, settings: ComplexitySettings) -> dict[str, Any]:
    """All measurements of one model at one point of a sweep, as a JSON-ready dict."""
    row: dict[str, Any] = {"model": model, **asdict(point)}
    if model != "man-had":
        row["random_features"] = None
    skip = _skip_reason(model, point, settings)
    if skip is not None:
        reason, needed = skip
        row |= {"status": "not run" if needed else "not applicable", "reason": reason,
                "predicted_bytes": needed}
        return row
    torch.manual_seed(settings.seed)
    try:
        module = _build(model, point, settings).eval()
    except ValueError as error:  # e.g. TFN's guard on the size of its outer product
        text = str(error)
        text = text if len(text) <= 160 else text[:157] + "..."
        return row | {"status": "not run", "reason": f"not run ({text})", "predicted_bytes": None}
    generator = torch.Generator().manual_seed(settings.seed)
    inputs = [
        torch.randn(point.batch, point.length, settings.hidden_dim, generator=generator)
        for _ in range(point.modalities)
    ]

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return module(inputs)

    def forward_backward() -> None:
        module.zero_grad(set_to_none=True)
        module(inputs).sum().backward()

    calls: dict[str, Callable[[], Any]] = {"forward": forward}
    if settings.backward:
        calls["forward_backward"] = forward_backward
    with LoadMonitor() as load:
        timings = time_interleaved(calls, warmup=settings.warmup, repeats=settings.repeats)
    row |= {
        "status": "ok",
        "reason": None,
        "predicted_bytes": None,
        "flops": count_flops(forward),
        "forward_s": timings["forward"].to_dict(),
        "forward_backward_s": timings["forward_backward"].to_dict() if settings.backward else None,
        "peak_bytes": peak_allocated_bytes(forward) if settings.memory else None,
        "parameters": sum(p.numel() for p in module.parameters()),
        "load": load.result(),
    }
    return row


def run_complexity(
    settings: ComplexitySettings,
    *,
    sweeps: Sequence[str] = SWEEPS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every model over every point of the chosen sweeps; returns the JSON payload."""
    unknown = set(settings.models) - set(MODELS)
    if unknown:
        raise ValueError(f"unknown model(s) {sorted(unknown)}; expected some of {', '.join(MODELS)}")
    unknown = set(sweeps) - set(SWEEPS)
    if unknown:
        raise ValueError(f"unknown sweep(s) {sorted(unknown)}; expected some of {', '.join(SWEEPS)}")
    rows = []
    points = [p for p in _points(settings) if p.sweep in sweeps]
    with LoadMonitor() as load:
        for index, point in enumerate(points):
            for model in settings.models:
                if point.sweep == "random_features" and model != "man-had":
                    continue  # only MAN's had mode has random features
                row = measure_point(model, point, settings)
                rows.append(row)
                if progress is not None:
                    progress(_describe(index, len(points), row))
    payload = result_header("complexity", settings.to_dict() | {"sweeps": list(sweeps)})
    payload["load"] = load.result()
    payload["rows"] = rows
    return payload


def _describe(index: int, total: int, row: dict[str, Any]) -> str:
    where = (f"[{index + 1}/{total}] {row['sweep']}: m={row['modalities']} T={row['length']} "
             f"H={row['random_features']} B={row['batch']} {row['model']}")
    if row["status"] != "ok":
        return f"{where}: {row['reason']}"
    return (f"{where}: {row['flops'] / 1e6:.1f} MFLOP, forward {row['forward_s']['median'] * 1e3:.2f} ms"
            + (f", peak {format_bytes(row['peak_bytes'])}" if row["peak_bytes"] is not None else ""))


def geometric_growth(values: Sequence[float], sizes: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(size): 1 for linear growth."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(v) for v in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    numerator = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    denominator = sum((x - mean_x) ** 2 for x in xs)
    return numerator / denominator if denominator else float("nan")
