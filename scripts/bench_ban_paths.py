#!/usr/bin/env python
"""BAN at the VQA size (2,048 / 1,024, 8 glimpses, 36 x 14, batch 32), eval mode: the
glimpse loop (what the CPU runs) against the batched residual chain (what CUDA runs),
forward and forward+backward; and the two layouts of z_g in the chain. Medians, one thread.

    python scripts/bench_ban_paths.py [--repeats 5]

The numbers behind ``polyfuse.nn.ban.chain_on`` and ``bilinear_residual_glimpses``'s
``one_product`` (issue 40).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import polyfuse.nn.ban as ban_module
from polyfuse.functional.bilinear import bilinear_residual_glimpses


def median_ms(call, repeats: int) -> float:
    call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ban_module.BAN([2048, 1024], 1024, hidden_dim=1024, glimpses=8).eval()
    x, y = torch.randn(32, 36, 2048), torch.randn(32, 14, 1024)

    def forward():
        with torch.no_grad():
            model([x, y])

    def forward_backward():
        model([x, y]).sum().backward()
        model.zero_grad(set_to_none=True)

    original = ban_module.chain_on
    for name, chain in (("glimpse loop", False), ("residual chain", True)):
        ban_module.chain_on = lambda device, chain=chain: chain
        print(f"BAN {name}: forward {median_ms(forward, args.repeats):.0f} ms, "
              f"forward+backward {median_ms(forward_backward, args.repeats):.0f} ms")
    ban_module.chain_on = original

    glimpses, rank = 8, 1024
    x_features = torch.randn(32, 36, glimpses, rank).relu()
    attention = torch.softmax(torch.randn(32, glimpses, 36 * 14), -1).view(32, glimpses, 36, 14)
    weights = (torch.randn(glimpses, rank, 1024) * 0.01, torch.zeros(glimpses, rank),
               torch.randn(glimpses, 1024, rank) * 0.01, torch.zeros(glimpses, 1024))
    for one_product in (True, False):
        ms = median_ms(lambda one=one_product: bilinear_residual_glimpses(
            x_features, y, attention, *weights, one_product=one), args.repeats)
        print(f"residual chain, z_g {'in one product' if one_product else 'per glimpse'}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
