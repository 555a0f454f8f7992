#!/usr/bin/env python
"""Where exact attention stops being faster than had: forward+backward time of a MAN
layer in each mode as the lengths grow (the evidence for ``mode="auto"``'s budget).

    python scripts/bench_auto_crossover.py [--lengths 8,16,24,32,48]
        [--batch 32] [--heads 4] [--features 64] [--threads 1] [--repeats 10]

MAN over 3 modalities of equal length T (input sizes 16 / 12 / 8, hidden 32, 4 heads,
4 LSC chunks), no padding; one training step (forward, sum, backward) timed per mode,
the modes interleaved so that load changes hit them alike. Prints one line per T with
the number of tuples batch x heads x T^3 and the median milliseconds of: exact, had
with the LSC part exact (the default), had with the LSC part estimated.
"""

from __future__ import annotations

import argparse

import torch

from polyfuse.bench.measure import time_interleaved
from polyfuse.nn import MAN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8,16,24,32,48")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=64, help="H, random features")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dims = (16, 12, 8)
    variants = {"exact": {"mode": "exact"}, "had, LSC exact": {"mode": "had"},
                "had, LSC estimated": {"mode": "had", "exact_lsc": False}}
    for length in (int(t) for t in args.lengths.split(",")):
        inputs = [torch.randn(args.batch, length, d) for d in dims]
        steps = {}
        for name, options in variants.items():
            torch.manual_seed(0)
            module = MAN(list(dims), 32, hidden_dim=32, heads=args.heads, chunks=4,
                         num_random_features=args.features, **options)

            def step(module=module) -> None:
                module(inputs).sum().backward()

            steps[name] = step
        times = time_interleaved(steps, warmup=2, repeats=args.repeats)
        tuples = args.batch * args.heads * length ** len(dims)
        cells = ", ".join(f"{name} {1e3 * timing.median:.1f} ms" for name, timing in times.items())
        print(f"T = {length}: {tuples:,} tuples: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
