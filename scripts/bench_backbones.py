"""MulT + MAN against MulT alone (and LSTM + LMF with and without MAN): training time
per epoch and inference latency, on MOSI-shaped inputs.

The models are built exactly as ``polyfuse compare`` builds them from
configs/mosi/backbones/ (base.yaml plus one model file each). Inputs are random,
of the contextual MOSI shape: windows of 16 utterances, text 100, audio 73 and video 100
features. A training epoch is ``--batches`` optimiser steps (forward, backward, AdamW
step) on batches of ``--batch-size``; inference is one forward pass in eval mode
on ``--eval-batch`` samples. Calls of all models are timed in turns (median over
``--repeats``) so that load changes hit them alike; the 1-minute load average is
written beside the numbers: timings on a loaded machine are not comparable.

    python scripts/bench_backbones.py --out docs/benchmarks/backbones.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from polyfuse.bench.measure import machine_info, time_interleaved
from polyfuse.engine.config import deep_merge, load_config, resolve_config
from polyfuse.tasks.registry import task_spec


def build_task(config, input_dims, names, label_info):
    """The task module of config's task type around a new backbone."""
    return task_spec(config["task"]["type"]).module_for(config, input_dims, names, label_info)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "mosi" / "backbones"
MODELS = ("mult", "mult_man", "lstm_lmf", "lstm_lmf_man")
DIMS, NAMES = (100, 73, 100), ("text", "audio", "video")


def build(name: str, threads: int):
    base = load_config(CONFIGS / "base.yaml")
    model = load_config(CONFIGS / f"{name}.yaml")
    config = resolve_config(deep_merge(base, {"model": model["model"]}))
    config["trainer"]["num_threads"] = threads
    task = build_task(config, list(DIMS), list(NAMES), {})
    return task


def batch(size: int, window: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(size, window, d, generator=generator) for d in DIMS]
    masks = [torch.ones(size, window, dtype=torch.bool) for _ in DIMS]
    centre = torch.randint(0, window, (size,), generator=generator)
    target = torch.empty(size).uniform_(-3, 3, generator=generator)
    return {"inputs": inputs, "masks": masks, "centre": centre, "target": target, "row": torch.arange(size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=39, help="optimiser steps per epoch (MOSI train: 1230 / 32)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=256)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = [m for m in args.models.split(",") if m]
    tasks = {name: build(name, args.threads) for name in names}
    train_batch, eval_batch = batch(args.batch_size, args.window), batch(args.eval_batch, args.window, 1)
    optimizers = {name: torch.optim.AdamW(task.parameters(), lr=1e-3) for name, task in tasks.items()}

    def epoch(name):
        task, optimizer = tasks[name], optimizers[name]
        task.train()
        for _ in range(args.batches):
            optimizer.zero_grad()
            task.compute_loss(task(train_batch), train_batch["target"]).backward()
            optimizer.step()

    def infer(name):
        task = tasks[name]
        task.eval()
        with torch.no_grad():
            task(eval_batch)

    load_before = os.getloadavg()[0]
    epochs = time_interleaved({n: (lambda n=n: epoch(n)) for n in names}, warmup=0, repeats=args.repeats)
    latency = time_interleaved({n: (lambda n=n: infer(n)) for n in names}, warmup=1, repeats=max(5, args.repeats))
    result = {
        "benchmark": "backbones",
        "settings": vars(args) | {"out": str(args.out) if args.out else None},
        "machine": machine_info(),
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "models": {
            n: {"parameters": sum(p.numel() for p in tasks[n].parameters()),
                "epoch_seconds": epochs[n].to_dict(), "inference_seconds": latency[n].to_dict()}
            for n in names
        },
    }
    print(f"load average (1 min) before / after: {result['load_average_1min']}")
    print("| model | parameters | s / training epoch | ms / inference batch |")
    print("|---|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {result['models'][n]['parameters']:,} | {epochs[n].median:.1f} | {1000 * latency[n].median:.0f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
