#!/usr/bin/env python
"""Count the host reads (tensor values read back to Python) of one forward of a
registered fusion module at each validation level.

    python scripts/count_host_reads.py [--module ban] [--input-dims 128 64] [--lengths 36 14]
        [--out-dim 64] [--batch 32] [OPTION=VALUE ...]

Every read goes through ``Tensor.__bool__``, ``__int__``, ``__float__``, ``__index__``,
``item``, ``tolist``, ``cpu`` or ``numpy``; each is wrapped with a counter for the call.
On a GPU each read is a synchronisation with the device.
"""

from __future__ import annotations

import argparse
import ast

import torch

import polyfuse

METHODS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy")


def count_reads(module: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    count = 0
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def counting(name: str):
        def method(self, *args, **kwargs):
            nonlocal count
            count += 1
            return originals[name](self, *args, **kwargs)
        return method

    try:
        for name in METHODS:
            setattr(torch.Tensor, name, counting(name))
        with torch.no_grad():
            module(inputs)
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default="ban")
    parser.add_argument("--input-dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--lengths", type=int, nargs="+", default=[36, 14])
    parser.add_argument("--out-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("options", nargs="*", help="module options, e.g. glimpses=8")
    args = parser.parse_args()
    options = {key: ast.literal_eval(value) for key, value in (o.split("=", 1) for o in args.options)}
    torch.manual_seed(0)
    module = polyfuse.nn.create(args.module, input_dims=args.input_dims, out_dim=args.out_dim, **options).eval()
    inputs = [torch.randn(args.batch, t, d) for t, d in zip(args.lengths, args.input_dims, strict=True)]
    if not hasattr(polyfuse, "validation"):  # a polyfuse from before the validation levels
        print(f"{args.module}: {count_reads(module, inputs)} host reads per forward")
        return
    for level in ("full", "shapes"):
        with polyfuse.validation(level):
            print(f"{args.module}: {count_reads(module, inputs)} host reads per forward at validation {level!r}")
    if "auto" in getattr(polyfuse._checks, "VALIDATION_LEVELS", ()):
        # The default level on a GPU: the CPU made to count as a device where reads synchronise.
        original = polyfuse._checks.reads_synchronise
        polyfuse._checks.reads_synchronise = lambda device: True
        try:
            with polyfuse.validation("auto"):
                reads = count_reads(module, inputs)
        finally:
            polyfuse._checks.reads_synchronise = original
        print(f"{args.module}: {reads} host reads per forward at validation 'auto' (the default) on a GPU")


if __name__ == "__main__":
    main()
