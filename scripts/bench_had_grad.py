#!/usr/bin/env python
"""Forward, and forward + backward, of had-mode multilinear attention (issue 14's lean backward).

    python scripts/bench_had_grad.py [--config retrieval|mosi] [--estimator gerf|arf]
        [--threads 1] [--repeats 5] [--chunks C]

``retrieval``: m = 7 modalities of T = 30 steps, 8 heads of K = K' = 64, H = 512, batch 32;
``mosi``: m = 3, T = 50, 10 heads of K = K' = 8, H = 24, batch 32. Features N(0, 0.3^2), values
N(0, 1), W orthogonal Gaussian per head. Prints the medians (ms) and forward+backward / forward.
``--chunks C``: MAN's default path, C LSC chunks whose logits are computed exactly
(``exact_lsc``; C^m <= 4096, so not for the retrieval configuration's 7 modalities).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from polyfuse.functional.multilinear import multilinear_attention, stacked_multilinear_attention
from polyfuse.functional.random_features import gaussian_random_matrix

CONFIGS = {
    "retrieval": {"modalities": 7, "length": 30, "heads": 8, "dim": 64, "features": 512, "batch": 32},
    "mosi": {"modalities": 3, "length": 50, "heads": 10, "dim": 8, "features": 24, "batch": 32},
}


def median_ms(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="retrieval")
    parser.add_argument("--estimator", choices=("gerf", "arf"), default="gerf")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=0,
                        help="C > 0: LSC vectors of C chunks, their logits computed exactly (MAN's default)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    c = CONFIGS[args.config]
    g = torch.Generator().manual_seed(0)
    shape = (c["batch"], c["heads"], c["length"], c["dim"])
    features = [(torch.randn(*shape, generator=g) * 0.3).requires_grad_() for _ in range(c["modalities"])]
    values = [torch.randn(*shape, generator=g).requires_grad_() for _ in range(c["modalities"])]
    matrix = torch.stack([gaussian_random_matrix(c["features"], c["dim"], orthogonal=True, generator=g)
                          for _ in range(c["heads"])])[None]

    if args.chunks:  # the modalities stacked along time, the LSC part exact
        lengths = [c["length"]] * c["modalities"]
        stacked_features = torch.cat(features, -2).detach().requires_grad_()
        stacked_values = torch.cat(values, -2).detach().requires_grad_()
        matrix = torch.stack([gaussian_random_matrix(c["features"], c["dim"] + args.chunks, generator=g)
                              for _ in range(c["heads"])])

        def attention():
            return stacked_multilinear_attention(stacked_features, stacked_values, lengths, mode="had",
                                                 random_matrix=matrix, estimator=args.estimator,
                                                 chunks=args.chunks, lsc_scale=0.5)
    else:
        def attention():
            return multilinear_attention(features, values, mode="had", random_matrix=matrix,
                                         estimator=args.estimator)

    def forward() -> None:
        with torch.no_grad():
            attention()

    def forward_backward() -> None:
        attention().sum().backward()

    fwd, both = median_ms(forward, args.repeats), median_ms(forward_backward, args.repeats)
    lsc = f", {args.chunks} LSC chunks exact" if args.chunks else ""
    print(f"{args.config}, {args.estimator}{lsc}, {args.threads} thread(s): forward {fwd:.1f} ms, "
          f"forward+backward {both:.1f} ms, ratio {both / fwd:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
