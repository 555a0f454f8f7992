"""``polyfuse bench targets``: the speed targets of docs/BENCHMARKS.md, each a ratio of two
measurements taken in turns in one run, so that the machine's load hits both alike.

1. exact / had forward time of one MAN layer, MOSI configuration (hidden size 40,
   10 heads, 24 random features, 4 chunks), m = 3, T = 50, batch 32: at least 50.
2. had forward time, m = 8 over m = 2 (T = 50): at most 4.5.
3. had forward time, T = 400 over T = 50 (m = 3): at most 10.
4. FLOP rate of the had attention at m = 7, T = 30, hidden size 512, 8 heads
   (K = 64 values, K' = 64 features plus 4 LSC chunks per head), H = 512, batch 32:
   at least 40% of the rate of a 2048 x 2048 x 2048 float32 matrix product timed in
   the same run. The FLOPs are counted by hand: per sample, head and modality, the
   exponent of Eq. 11 (2 T (K' + C) H) and the contraction of Eq. 10 (2 T H K), the
   two matrix products of the method; the counter's figure, which also counts the
   |a|^2 / 2 column our product carries, is recorded beside it. The timed call is
   :func:`polyfuse.functional.multilinear_attention` on the inputs the MAN layer
   builds (features (B, G, T, K' + C), values (B, G, T, K), masks (B, 1, T)); the
   whole layer (with its projections) is recorded too.

Forward passes run under ``torch.no_grad`` in eval mode (inference). Each ratio is the
median over rounds of the ratio within a round (the two calls of a round run back to
back, under the same load), reported with its quartiles; the run uses a fixed number of
threads (``threads``, default 2), recorded in the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from polyfuse.bench.measure import (
    LoadMonitor,
    count_flops,
    paired_ratio,
    summary,
    time_interleaved_samples,
)
from polyfuse.bench.results import result_header
from polyfuse.functional import gaussian_random_matrix, lsc_encoding, multilinear_attention
from polyfuse.nn.man import MAN

__all__ = ["QUICK_SIZES", "TARGETS", "TargetSizes", "had_flops_by_hand", "run_targets"]

TARGETS = {
    "exact_over_had": {"threshold": 50.0, "direction": ">="},
    "modalities_8_over_2": {"threshold": 4.5, "direction": "<="},
    "length_400_over_50": {"threshold": 10.0, "direction": "<="},
    "had_flop_rate_fraction": {"threshold": 0.40, "direction": ">="},
}
MOSI = {"hidden_dim": 40, "heads": 10, "num_random_features": 24, "chunks": 4}
RETRIEVAL = {"modalities": 7, "length": 30, "hidden_dim": 512, "heads": 8,
             "num_random_features": 512, "chunks": 4, "batch": 32}


def had_flops_by_hand(
    *, batch: int, heads: int, lengths: list[int], feature_dim: int, value_dim: int,
    num_random_features: int,
) -> int:
    """Matrix-product FLOPs of had mode: sum_j 2 T_j H (K' + K) per sample and head."""
    return batch * heads * sum(
        2 * t * num_random_features * (feature_dim + value_dim) for t in lengths
    )


def _mosi_layer(mode: str, modalities: int) -> MAN:
    hidden = MOSI["hidden_dim"]
    return MAN([hidden] * modalities, hidden, hidden_dim=hidden, heads=MOSI["heads"],
               num_random_features=MOSI["num_random_features"], chunks=MOSI["chunks"],
               mode=mode).eval()


def _forward(module: MAN, inputs: list[torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            module(inputs)

    return run


def _inputs(batch: int, length: int, modalities: int, dim: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, length, dim, generator=generator) for _ in range(modalities)]


def _verdict(name: str, value: float) -> dict[str, Any]:
    target = TARGETS[name]
    ok = value >= target["threshold"] if target["direction"] == ">=" else value <= target["threshold"]
    return {"value": value, **target, "passed": bool(ok)}


def retrieval_attention_inputs(config: dict[str, int] | None = None, seed: int = 0) -> dict[str, Any]:
    """The had attention's inputs in the retrieval configuration, as the MAN layer
    builds them (features with the LSC columns, masks (B, 1, T))."""
    config = config or RETRIEVAL
    generator = torch.Generator().manual_seed(seed)
    batch, heads, length = config["batch"], config["heads"], config["length"]
    value_dim = config["hidden_dim"] // heads
    lsc = lsc_encoding(length, config["chunks"], 0.5).expand(batch, heads, length, config["chunks"])
    features, values = [], []
    for _ in range(config["modalities"]):
        a = torch.randn(batch, heads, length, value_dim, generator=generator) / value_dim**0.5
        features.append(torch.cat([a, lsc], dim=-1))
        values.append(torch.randn(batch, heads, length, value_dim, generator=generator))
    random_features = torch.stack([
        gaussian_random_matrix(config["num_random_features"], value_dim + config["chunks"],
                               generator=generator)
        for _ in range(heads)
    ])
    masks = [torch.ones(batch, 1, length, dtype=torch.bool)] * config["modalities"]
    return {"features": features, "values": values, "masks": masks,
            "random_features": random_features, "temperature": 1 / value_dim**0.5}


@dataclass(frozen=True)
class TargetSizes:
    """The sizes the targets are measured at: the issue's, or tiny ones for tests."""

    batch: int = 32
    length: int = 50
    long_length: int = 400
    few_modalities: int = 2
    many_modalities: int = 8
    retrieval: dict[str, int] = field(default_factory=lambda: dict(RETRIEVAL))
    matmul_size: int = 2048


QUICK_SIZES = TargetSizes(
    batch=2, length=6, long_length=12, few_modalities=2, many_modalities=3,
    retrieval={"modalities": 3, "length": 4, "hidden_dim": 16, "heads": 2,
               "num_random_features": 8, "chunks": 4, "batch": 2},
    matmul_size=64,
)


def run_targets(
    *,
    repeats: int = 15,
    warmup: int = 2,
    sizes: TargetSizes | None = None,
    threads: int | None = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the four targets; returns the JSON payload. ``sizes`` other than the
    default (e.g. :data:`QUICK_SIZES`, for tests) do not measure the issue's targets
    and are recorded as such. ``threads``: torch's intra-op threads for the run
    (None keeps the current setting); restored afterwards."""
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_targets(repeats, warmup, sizes or TargetSizes(), progress)
    finally:
        torch.set_num_threads(previous_threads)


def _timed(calls: dict[str, Callable[[], None]], warmup: int, repeats: int) -> tuple[dict[str, Any], dict[str, list[float]]]:
    samples = time_interleaved_samples(calls, warmup=warmup, repeats=repeats)
    return {name: summary(values) for name, values in samples.items()}, samples


def _run_targets(
    repeats: int, warmup: int, sizes: TargetSizes, progress: Callable[[str], None] | None
) -> dict[str, Any]:
    measurements: dict[str, Any] = {}
    loads: dict[str, Any] = {}

    def report(name: str, text: str) -> None:
        if progress is not None:
            progress(f"{name}: {text}")

    # 1. exact over had, MOSI configuration.
    batch, length = sizes.batch, sizes.length
    inputs = _inputs(batch, length, 3, MOSI["hidden_dim"], 0)
    calls = {mode: _forward(_mosi_layer(mode, 3), inputs) for mode in ("exact", "had")}
    with LoadMonitor() as load:
        timings, samples = _timed(calls, warmup, repeats)
    loads["exact_over_had"] = load.result()
    paired = paired_ratio(samples, "exact", "had")
    ratio = paired["median"]
    measurements["exact_over_had"] = {
        "exact_s": timings["exact"].to_dict(), "had_s": timings["had"].to_dict(), "ratio": paired,
        **_verdict("exact_over_had", ratio)}
    report("exact / had", f"{ratio:.1f}")

    # 2. growth with the number of modalities (T = 50).
    few, many = sizes.few_modalities, sizes.many_modalities
    calls = {name: _forward(_mosi_layer("had", m), _inputs(batch, length, m, MOSI["hidden_dim"], m))
             for name, m in (("few", few), ("many", many))}
    with LoadMonitor() as load:
        timings, samples = _timed(calls, warmup, repeats)
    loads["modalities_8_over_2"] = load.result()
    paired = paired_ratio(samples, "many", "few")
    ratio = paired["median"]
    measurements["modalities_8_over_2"] = {
        "modalities": [few, many], "ratio": paired,
        "m2_s": timings["few"].to_dict(), "m8_s": timings["many"].to_dict(),
        **_verdict("modalities_8_over_2", ratio)}
    report("had m=8 / m=2", f"{ratio:.2f}")

    # 3. growth with the length (m = 3).
    layer = _mosi_layer("had", 3)
    calls = {name: _forward(layer, _inputs(batch, t, 3, MOSI["hidden_dim"], t))
             for name, t in (("short", length), ("long", sizes.long_length))}
    with LoadMonitor() as load:
        timings, samples = _timed(calls, warmup, repeats)
    loads["length_400_over_50"] = load.result()
    paired = paired_ratio(samples, "long", "short")
    ratio = paired["median"]
    measurements["length_400_over_50"] = {
        "lengths": [length, sizes.long_length], "ratio": paired,
        "T50_s": timings["short"].to_dict(), "T400_s": timings["long"].to_dict(),
        **_verdict("length_400_over_50", ratio)}
    report("had T=400 / T=50", f"{ratio:.2f}")

    # 4. FLOP rate of the had attention against a 2048^3 matrix product.
    config = sizes.retrieval
    attention = retrieval_attention_inputs(config)
    value_dim = config["hidden_dim"] // config["heads"]
    hand = had_flops_by_hand(
        batch=config["batch"], heads=config["heads"], lengths=[config["length"]] * config["modalities"],
        feature_dim=value_dim + config["chunks"], value_dim=value_dim,
        num_random_features=config["num_random_features"],
    )

    def had_attention() -> None:
        with torch.no_grad():
            multilinear_attention(
                attention["features"], attention["values"], attention["masks"], mode="had",
                random_matrix=attention["random_features"], temperature=attention["temperature"],
            )

    counted = count_flops(had_attention)
    module = MAN([config["hidden_dim"]] * config["modalities"], config["hidden_dim"],
                 hidden_dim=config["hidden_dim"], heads=config["heads"],
                 num_random_features=config["num_random_features"], chunks=config["chunks"]).eval()
    module_inputs = _inputs(config["batch"], config["length"], config["modalities"],
                            config["hidden_dim"], 7)
    module_forward = _forward(module, module_inputs)
    module_flops = count_flops(module_forward)
    size = sizes.matmul_size
    matmul_a = torch.randn(size, size)
    matmul_b = torch.randn(size, size)
    matmul_out = torch.empty(size, size)
    with LoadMonitor() as load:
        timings, samples = _timed(
            {"matmul": lambda: torch.mm(matmul_a, matmul_b, out=matmul_out),
             "had_attention": had_attention, "man_layer": module_forward},
            warmup, repeats,
        )
    loads["had_flop_rate_fraction"] = load.result()
    matmul_rate = 2 * size**3 / timings["matmul"].median
    # Per round: (hand FLOPs / had time) / (matmul FLOPs / matmul time).
    paired = paired_ratio(samples, "matmul", "had_attention")
    paired = {key: value * hand / (2 * size**3) if key != "rounds" else value
              for key, value in paired.items()}
    had_rate = paired["median"] * matmul_rate
    measurements["had_flop_rate_fraction"] = {
        "matmul_s": timings["matmul"].to_dict(), "matmul_flop_rate": matmul_rate,
        "had_s": timings["had_attention"].to_dict(), "had_flops_by_hand": hand,
        "had_flops_counted": counted, "had_flop_rate": had_rate,
        "man_layer_s": timings["man_layer"].to_dict(), "man_layer_flops_counted": module_flops,
        "man_layer_flop_rate_fraction": module_flops / timings["man_layer"].median / matmul_rate,
        "fraction": paired, **_verdict("had_flop_rate_fraction", paired["median"])}
    report("had FLOP rate / matmul rate", f"{paired['median']:.2f}")

    settings = {"repeats": repeats, "warmup": warmup, "mosi": MOSI, "sizes": asdict(sizes),
                "issue_sizes": sizes == TargetSizes(), "threads": torch.get_num_threads(),
                "interop_threads": torch.get_num_interop_threads()}
    payload = result_header("targets", settings)
    payload["targets"] = measurements
    payload["load"] = loads
    return payload

