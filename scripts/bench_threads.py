"""Training wall time and metrics at different thread counts (issue 17, "Threads").

Trains each config for a few epochs once per thread count and repetition, each run in
a fresh process (``polyfuse train``), the thread counts alternating (1, 2, 1, 2, ...)
so that a drift of the machine's load hits them alike. Records per run the wall time
of the process, the training time and test metrics from ``results.json``, the thread
plan the run printed and the machine's load, then prints a Markdown table.

    python scripts/bench_threads.py --configs configs/mosi/man.yaml \\
        --threads 1 2 --epochs 3 --repeats 2 --out runs/threads --json docs/benchmarks/threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from polyfuse.bench.measure import LoadMonitor, machine_info


def _run(config: str, threads: str, epochs: int, out: Path) -> dict:
    command = [sys.executable, "-m", "polyfuse.cli.main", "train", "--config", config, "--max-epochs", str(epochs),
               "--set", "trainer.patience=0", "--no-progress", "--quiet", "--out", str(out)]
    if threads != "default":
        command += ["--set", f"trainer.num_threads={threads}"]
    start = time.perf_counter()
    with LoadMonitor() as load:
        finished = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), check=False)
    wall = time.perf_counter() - start
    if finished.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{finished.stderr[-2000:]}")
    results = json.loads((out / "results.json").read_text())
    line = next((text for text in finished.stdout.splitlines() if text.startswith("threads:")), None)
    return {"config": config, "threads": threads, "wall_s": wall, "train_s": results["train_seconds"],
            "test": results["test"], "validation": results["validation"], "plan": results.get("threads"),
            "printed": line, "load": load.result()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--threads", nargs="+", default=["1", "2"], help="counts, or 'default'")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/threads"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    runs = []
    for config in args.configs:
        for repeat in range(args.repeats):
            for threads in args.threads:
                out = args.out / f"{Path(config).stem}-t{threads}-r{repeat}"
                runs.append(_run(config, threads, args.epochs, out))
                print(f"{config} threads={threads} repeat {repeat}: {runs[-1]['wall_s']:.1f} s", file=sys.stderr)
                if args.json:  # after every run: a long run stopped part-way keeps what was measured
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    payload = {"machine": machine_info(), "epochs": args.epochs, "runs": runs}
                    args.json.write_text(json.dumps(payload, indent=1) + "\n")
    print("| config | threads | wall s (each run) | train s (median) | test metrics (each run) | load average |")
    print("|---|---|---|---:|---|---|")
    for config in args.configs:
        for threads in args.threads:
            mine = [run for run in runs if run["config"] == config and run["threads"] == threads]
            metrics = "; ".join(", ".join(f"{k} {v:.4f}" for k, v in sorted(run["test"].items())) for run in mine)
            walls = ", ".join(f"{run['wall_s']:.1f}" for run in mine)
            loads = ", ".join(f"{run['load']['loadavg_1min']:.1f}" for run in mine)
            train_s = statistics.median(run["train_s"] for run in mine)
            print(f"| {Path(config).name} | {threads} | {walls} | {train_s:.1f} | {metrics} | {loads} |")


if __name__ == "__main__":
    main()
