"""One table from the runs.csv files of several `polyfuse compare` runs of the same base
config (e.g. models split over processes to use both cores):

    python scripts/merge_compare.py --config configs/mosi/man.yaml runs/mosi3/*/runs.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from polyfuse.engine.build import monitor_of
from polyfuse.engine.compare import constant_baselines, format_summary, summarise
from polyfuse.engine.config import load_config, resolve_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the base config of the compare runs")
    parser.add_argument("runs", nargs="+", type=Path, help="runs.csv files")
    parser.add_argument("--figure", type=Path, help="task.type vqa: also draw the accuracy bars (PNG) here")
    args = parser.parse_args()
    records = []
    for path in args.runs:
        with path.open(newline="") as handle:
            records += list(csv.DictReader(handle))
    base = resolve_config(load_config(args.config))
    summary = summarise(records, validation_key=monitor_of(base)[0].replace("/", "_"))
    if base["task"]["type"] == "vqa":  # one table: VQA accuracy overall and per type
        from polyfuse.tasks.vqa.report import format_vqa_summary, plot_vqa_summary

        print(format_vqa_summary(summary))
        if args.figure:
            plot_vqa_summary(summary, args.figure)
        return
    print(format_summary(summary, constant_baselines(base)))


if __name__ == "__main__":
    main()
