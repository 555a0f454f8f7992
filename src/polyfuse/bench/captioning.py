"""``polyfuse bench captioning``: one caption-decoder step, HOCA vs Low-Rank HOCA, 3 to 6 modalities.

One step of :class:`~polyfuse.nn.decoding.CaptionDecoder` (LSTM cell, MAF over n
modalities conditioned on h_t, Eq. 22 output layer) in eval mode without
gradients, for the orders ``UBT`` (the paper's HOCA-UBT / L-HOCA-UBT: every
modality alone, every pair, and all n together) and ``T`` (all n together only):
median wall time (interleaved: exact and low rank in turns) and the peak memory
PyTorch allocates during the step (see :mod:`polyfuse.bench.measure`). The exact
n-th order term builds a correlation tensor of ``B * T ** n`` entries, so its cost
grows exponentially with n; the low-rank term is linear in n. The pairs of ``UBT``
grow as n (n - 1) / 2 in both.

The machine's load during the run is recorded with the result (``load``):
timings taken on a shared machine are inflated; rerun on a quiet one for claims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from polyfuse.bench.measure import LoadMonitor, peak_allocated_bytes, time_interleaved
from polyfuse.bench.results import format_bytes, result_header
from polyfuse.nn.decoding import CaptionDecoder

__all__ = ["FULL", "QUICK", "CaptioningBenchSettings", "captioning_markdown", "run_captioning_bench"]


@dataclasses.dataclass(frozen=True)
class CaptioningBenchSettings:
    modalities: tuple[int, ...] = (3, 4, 5, 6)
    orders: tuple[str, ...] = ("UBT", "T")
    length: int = 8  # T, every modality
    feature_dim: int = 32
    hidden_dim: int = 128
    attention_dim: int = 32
    vocab_size: int = 1000
    batch: int = 8
    rank: int = 1
    repeats: int = 15
    warmup: int = 3
    seed: int = 0


FULL = CaptioningBenchSettings()
QUICK = dataclasses.replace(FULL, modalities=(3, 4), orders=("T",), length=4, hidden_dim=16, attention_dim=8,
                            vocab_size=50, batch=2, repeats=2, warmup=1)


def _step(settings: CaptioningBenchSettings, count: int, orders: str, low_rank: bool) -> Callable[[], Any]:
    torch.manual_seed(settings.seed)
    decoder = CaptionDecoder(
        [settings.feature_dim] * count, settings.vocab_size, embed_dim=settings.feature_dim,
        hidden_dim=settings.hidden_dim, orders=orders, low_rank=low_rank, attention_dim=settings.attention_dim,
        rank=settings.rank, max_lengths=settings.length,
    ).eval()
    inputs = [torch.randn(settings.batch, settings.length, settings.feature_dim) for _ in range(count)]
    sequences, masks = decoder.prepare(inputs)
    state = decoder.initial_state(sequences, masks)
    words = torch.randint(4, settings.vocab_size, (settings.batch,))

    def step() -> Any:
        with torch.no_grad():
            return decoder.step(words, state, sequences, masks)

    return step


def run_captioning_bench(
    settings: CaptioningBenchSettings = FULL, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Time and peak memory of one decoder step per (orders, n, exact / low rank)."""
    payload = result_header("captioning", dataclasses.asdict(settings))
    rows = []
    with LoadMonitor() as load:
        for orders in settings.orders:
            for count in settings.modalities:
                steps = {
                    "exact": _step(settings, count, orders, False),
                    "low_rank": _step(settings, count, orders, True),
                }
                timing = time_interleaved(steps, warmup=settings.warmup, repeats=settings.repeats)
                row: dict[str, Any] = {"orders": orders, "modalities": count}
                for name, fn in steps.items():
                    row[f"{name}_seconds"] = timing[name].median
                    row[f"{name}_peak_bytes"] = peak_allocated_bytes(fn)
                rows.append(row)
                if progress:
                    progress(
                        f"{orders} n={count}: exact {1e3 * row['exact_seconds']:.2f} ms "
                        f"{format_bytes(row['exact_peak_bytes'])}, low rank {1e3 * row['low_rank_seconds']:.2f} ms "
                        f"{format_bytes(row['low_rank_peak_bytes'])}"
                    )
    payload["rows"] = rows
    payload["load"] = load.result()
    return payload


def captioning_markdown(payload: dict[str, Any], image: str = "captioning_decoder_step.png") -> str:
    """The section of docs/BENCHMARKS.md (written to docs/benchmarks/captioning.md)."""
    settings, load = payload["settings"], payload.get("load") or {}
    busy = load.get("machine_busy")
    load_text = (
        f"machine busy {100 * busy:.0f}% of all CPUs, this run {100 * load['own']:.0f}%, other processes "
        f"{100 * load['others']:.0f}%, load average {load['loadavg_1min']:.2f}" if busy is not None else "load not recorded"
    )
    lines = [
        "## Video captioning: one decoder step, HOCA vs Low-Rank HOCA",
        "",
        "`polyfuse bench captioning --output-dir docs/benchmarks --threads 1` (writes captioning.json, "
        "the plot and this section, docs/benchmarks/captioning.md), then `python scripts/write_benchmarks_md.py`.",
        "",
        f"One step of the caption decoder (LSTM cell, MAF, output layer; eval mode, no gradients), "
        f"T = {settings['length']} steps per modality, batch {settings['batch']}, features {settings['feature_dim']}, "
        f"hidden {settings['hidden_dim']}, attention {settings['attention_dim']}, vocabulary "
        f"{settings['vocab_size']}, rank {settings['rank']}; median of {settings['repeats']} interleaved calls. "
        f"UBT: unary, every pair and all n together (the paper's HOCA-UBT); T: all n together only. "
        f"Measured {payload['created']} with {payload['machine']['torch_threads']} thread(s); {load_text}. "
        "**Timings on a shared machine are inflated: rerun on a quiet one for claims.**",
        "",
        f"![decoder step](benchmarks/{image})",
        "",
        "| orders | n | HOCA ms | L-HOCA ms | HOCA / L-HOCA | HOCA peak | L-HOCA peak |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in payload["rows"]:
        lines.append(
            f"| {r['orders']} | {r['modalities']} | {1e3 * r['exact_seconds']:.2f} | {1e3 * r['low_rank_seconds']:.2f} | "
            f"{r['exact_seconds'] / r['low_rank_seconds']:.1f} | {format_bytes(r['exact_peak_bytes'])} | "
            f"{format_bytes(r['low_rank_peak_bytes'])} |"
        )
    return "\n".join(lines) + "\n"
