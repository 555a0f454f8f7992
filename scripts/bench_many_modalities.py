#!/usr/bin/env python
"""One MAN layer over many modalities: exact attention, had with the LSC part exact (the
default), had with it estimated; forward+backward and forward, one thread, medians.

    python scripts/bench_many_modalities.py [--repeats 5] [--out FILE.json]

Issue 42's table: 6 modalities of the handwritten-digits sizes 240/76/216/47/64/6, hidden
40, 10 heads, H = 24, 4 chunks, batch 32, lengths T = 1 and T = 4 for every modality;
plus the demo's size (3 modalities) to show what the histogram recursion costs there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from polyfuse.nn import MAN

CASES = {
    "digits": (240, 76, 216, 47, 64, 6),
}


def build(dims, mode, exact_lsc, seed=0):
    torch.manual_seed(seed)
    return MAN(list(dims), 10, hidden_dim=40, heads=10, num_random_features=24, chunks=4, mode=mode,
               exact_lsc=exact_lsc)


def time_call(model, inputs, backward, repeats):
    def run():
        if backward:
            leaves = [x.detach().requires_grad_() for x in inputs]
            model(leaves).sum().backward()
        else:
            with torch.no_grad():
                model(inputs)
    run()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    generator = torch.Generator().manual_seed(0)
    for dims in [(240, 76, 216, 47, 64, 6), (300, 74, 35)]:
        for length in (1, 4, 8):
            inputs = [torch.randn(32, length, d, generator=generator) for d in dims]
            row = {"modalities": len(dims), "length": length}
            for name, mode, exact_lsc in (("exact", "exact", True), ("had_lsc_exact", "had", True),
                                          ("had_lsc_estimated", "had", False)):
                model = build(dims, mode, exact_lsc).train()
                row[f"{name}_fwd_bwd_ms"] = time_call(model, inputs, True, args.repeats)
                row[f"{name}_fwd_ms"] = time_call(model.eval(), inputs, False, args.repeats)
            rows.append(row)
            print(" | ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"torch": torch.__version__, "threads": 1, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
