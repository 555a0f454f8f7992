"""``polyfuse bench paper``: the MAN paper's CMU-MOSI figures beside ours.

The configuration is the paper's (section 3.2): one integration layer, hidden size
40, 10 heads, 24 random features, 4 LSC chunks, three modalities (text, audio,
video) brought to the hidden size by the backbone. The paper does not state the
sequence length. We assume **50 steps per modality**: the word-aligned CMU-MOSI of
MulT (Tsai et al., ACL 2019; the backbone of MAN (Transformer), ref. [29] of the
paper) pads or cuts every modality to 50 words, and the exact variant's cost
depends on T^3, so the length matters. 20 steps (the length used by the LMF-era
pipelines) is reported too. The variants are the paper's Table 4:

* MAN: ``mode="had"``, 4 chunks, the LSC vectors estimated (``exact_lsc=False``, the
  paper's computation); w/o HAD: ``mode="exact"``, 4 chunks;
* w/o CAO: ``mode="hadamard"`` (the continued Hadamard product, no LSC);
* w/o LSC: ``mode="had"``, no chunks.

FLOPs are counted per sample (batch 1) for one layer (projections U'_j, U''_j,
attention, pooling P) by ``FlopCounterMode`` (matrix products only, see
:mod:`polyfuse.bench.measure`), with the attention alone beside it. The paper does
not say what its counter counts, so its absolute numbers and ours need not agree;
the ratios between variants are what should carry over. Times are for one pass of
one layer over the 689 test samples in batches of 32, on this CPU; the paper's
appendix Table 1 reports the whole model on an RTX 3080 Ti.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polyfuse.bench.measure import LoadMonitor, time_interleaved
from polyfuse.bench.results import result_header
from polyfuse.nn.man import MAN

__all__ = [
    "PAPER_FLOPS",
    "PAPER_INFERENCE_SECONDS",
    "VARIANTS",
    "attention_flops_by_hand",
    "integration_layer_flops",
    "run_paper",
]

# MAN paper, Table 4: FLOPs of one integration layer on CMU-MOSI.
PAPER_FLOPS = {"MAN": 3.87e5, "w/o HAD": 10.23e6, "w/o CAO": 8.31e6, "w/o LSC": 3.07e5}
# MAN appendix, Table 1: inference time (s) over the 689 test samples, batch 32, RTX 3080 Ti.
PAPER_INFERENCE_SECONDS = {"MAN": 0.192, "w/o HAD": 0.352, "w/o CAO": 0.346, "w/o LSC": 0.182}
VARIANTS = {
    # the paper's computation: the LSC vectors estimated with the rest. polyfuse's default
    # (exact_lsc=True) sums the 4^3 chunk tuples exactly, which at T = 50 counts
    # 378,560 attention FLOPs against these 121,280 (tests/bench/test_bench_flops.py).
    "MAN": {"mode": "had", "chunks": 4, "exact_lsc": False},
    "w/o HAD": {"mode": "exact", "chunks": 4},
    "w/o CAO": {"mode": "hadamard", "chunks": 0},
    "w/o LSC": {"mode": "had", "chunks": 0, "exact_lsc": False},
}
MOSI = {"hidden_dim": 40, "heads": 10, "num_random_features": 24, "modalities": 3}
TEST_SAMPLES = 689
BATCH = 32


def build_variant(name: str, *, seed: int = 0) -> MAN:
    """One MAN integration layer in the paper's CMU-MOSI configuration."""
    hidden = MOSI["hidden_dim"]
    return MAN(
        [hidden] * MOSI["modalities"], hidden, hidden_dim=hidden, heads=MOSI["heads"],
        num_random_features=MOSI["num_random_features"], seed=seed, **VARIANTS[name],
    ).eval()


def integration_layer_flops(module: MAN, length: int) -> dict[str, int]:
    """FLOPs of one sample through the layer: total, projections, attention + pooling."""
    from torch.utils.flop_counter import FlopCounterMode

    inputs = [torch.randn(1, length, d) for d in module.input_dims]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(inputs)
    counts = counter.get_flop_counts()
    total = int(counter.get_total_flops())
    projections = sum(
        sum(counts.get(name, {}).values())
        for name, child in _named_modules_as_counted(module)
        if isinstance(child, nn.Linear)
    )
    return {"total": total, "projections": int(projections), "attention": total - int(projections)}


def _named_modules_as_counted(module: nn.Module) -> list[tuple[str, nn.Module]]:
    # FlopCounterMode names submodules from the root class name: "MAN.layers.0...".
    root = type(module).__name__
    return [(f"{root}.{name}" if name else root, child) for name, child in module.named_modules()]


def attention_flops_by_hand(*, mode: str, length: int, chunks: int) -> int:
    """Matrix-product FLOPs of the attention of one MOSI sample, counted by hand.

    had: per head and modality, the exponent of Eq. 11 (2 T (K' + C) H) and the
    contraction of Eq. 10 (2 T H K). exact (w/o HAD): the pair logits of Eq. 7
    (2 T^2 (K' + C) per pair) and the weighted sum of Eq. 5 over T^3 tuples, which
    our einsum runs as three products (2 T^3 K, 2 T^2 K, 2 T K per head). hadamard:
    2 T^3 K' for the continued product of the logits (one contraction over k of a
    T^2 K' by T K' pair) plus the same weighted sum. The pooling P (2 K^2 per head)
    is included. This is what the counter should see; the test checks it.
    """
    heads, hidden, m = MOSI["heads"], MOSI["hidden_dim"], MOSI["modalities"]
    value_dim = hidden // heads
    feature_dim = value_dim + chunks
    pooling = 2 * value_dim * value_dim
    if mode == "had":
        per_modality = 2 * length * feature_dim * MOSI["num_random_features"]
        per_modality += 2 * length * MOSI["num_random_features"] * value_dim
        return heads * (m * per_modality + pooling)
    weighted_sum = 2 * value_dim * (length**3 + length**2 + length)
    pairs = m * (m - 1) // 2
    logits = pairs * 2 * length**2 * feature_dim if mode == "exact" else 2 * length**3 * feature_dim
    return heads * (logits + weighted_sum + pooling)


def run_paper(
    *,
    lengths: tuple[int, ...] = (50, 20),
    repeats: int = 5,
    warmup: int = 1,
    timing: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """FLOPs and times of the four variants at each length; returns the JSON payload."""
    results = []
    with LoadMonitor() as load:
        for length in lengths:
            modules = {name: build_variant(name) for name in VARIANTS}
            entry: dict[str, Any] = {"length": length, "variants": {}}
            for name, module in modules.items():
                flops = integration_layer_flops(module, length)
                flops["attention_by_hand"] = attention_flops_by_hand(
                    mode=VARIANTS[name]["mode"], length=length, chunks=VARIANTS[name]["chunks"]
                )
                entry["variants"][name] = {"flops": flops, "paper_flops": PAPER_FLOPS[name]}
            if timing:
                batches = _test_set_batches(length)
                timings = time_interleaved(
                    {name: _one_pass(module, batches) for name, module in modules.items()},
                    warmup=warmup, repeats=repeats,
                )
                for name, value in timings.items():
                    entry["variants"][name]["test_set_seconds"] = value.to_dict()
                    entry["variants"][name]["paper_seconds"] = PAPER_INFERENCE_SECONDS[name]
            _add_ratios(entry)
            results.append(entry)
            if progress is not None:
                progress(_describe(entry))
    settings = {"lengths": list(lengths), "repeats": repeats, "warmup": warmup, "timing": timing,
                **MOSI, "test_samples": TEST_SAMPLES, "batch": BATCH,
                "variants": VARIANTS}
    payload = result_header("paper", settings)
    payload["primary_length"] = lengths[0]
    payload["load"] = load.result()
    payload["results"] = results
    return payload


def _one_pass(module: MAN, batches: list[list[torch.Tensor]]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            for inputs in batches:
                module(inputs)

    return run


def _test_set_batches(length: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for start in range(0, TEST_SAMPLES, BATCH):
        size = min(BATCH, TEST_SAMPLES - start)
        batches.append([
            torch.randn(size, length, MOSI["hidden_dim"], generator=generator)
            for _ in range(MOSI["modalities"])
        ])
    return batches


def _add_ratios(entry: dict[str, Any]) -> None:
    """Each variant against MAN: FLOPs (total, attention), the paper's, and times."""
    variants = entry["variants"]
    man = variants["MAN"]
    for values in variants.values():
        values["ratio_to_man"] = {
            "flops_total": values["flops"]["total"] / man["flops"]["total"],
            "flops_attention": values["flops"]["attention"] / man["flops"]["attention"],
            "paper_flops": values["paper_flops"] / man["paper_flops"],
        }
        if "test_set_seconds" in values:
            values["ratio_to_man"]["seconds"] = (
                values["test_set_seconds"]["median"] / man["test_set_seconds"]["median"]
            )
            values["ratio_to_man"]["paper_seconds"] = (
                values["paper_seconds"] / man["paper_seconds"]
            )


def _describe(entry: dict[str, Any]) -> str:
    parts = []
    for name, values in entry["variants"].items():
        parts.append(f"{name} {values['flops']['total']:.3g} FLOPs "
                     f"(x{values['ratio_to_man']['flops_total']:.2f}; paper x"
                     f"{values['ratio_to_man']['paper_flops']:.2f})")
    return f"T={entry['length']}: " + ", ".join(parts)
