"""Decode captioning runs again with ``<unk>`` allowed (same weights) and score them.

``captioning.allow_unknown`` only changes decoding, so its effect is measured on the
trained checkpoints themselves (docs/RESULTS.md, "Why the 0.3.0 defaults score lower"):

    python scripts/captioning_allow_unknown.py --out runs/ablate/unk/hoca_b \\
        runs/msvd-captioning-2streams-b/hoca_b/seed0 runs/msvd-captioning-2streams-b/hoca_b/seed1 \\
        runs/msvd-captioning-2streams-c/hoca_b/seed2

Each RUN folder's checkpoints/best.safetensors is tested on the test split as
``polyfuse evaluate`` does; OUT/<seed folder>/ gets results.json (the run's, with the new
test metrics) and test_captions.json.
"""

import argparse
import csv
import json
from pathlib import Path

import torch

from polyfuse.data.formats.captioning import UNKNOWN
from polyfuse.engine.run import load_model, prefixed_metrics, quiet_trainer
from polyfuse.tasks.registry import task_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for folder in args.runs:
        checkpoint = folder / "checkpoints/best.safetensors"
        task, extras = load_model(checkpoint)
        task.allow_unknown = True
        spec = task_spec("captioning")
        data = spec.checkpoint_data(extras, split="test")
        spec.bind(task, data)
        (loader,) = spec.loaders(data, "test").values()
        metrics = prefixed_metrics(quiet_trainer(extras["config"]).test(task, dataloaders=loader, verbose=False), "test")
        with torch.no_grad():
            outputs = quiet_trainer(extras["config"]).predict(task, dataloaders=loader)
        captions = {video: caption for batch in outputs for video, caption in batch.items()}
        original = json.loads((folder / "results.json").read_text())
        rows = [r for r in csv.DictReader((folder / "csv/version_0/metrics.csv").open()) if r.get("val/loss")]
        losses = [float(r["val/loss"]) for r in rows[: original["epochs"]]]
        result = {**original, "test": metrics, "allow_unknown": True, "checkpoint": str(checkpoint),
                  "best_epoch": original.get("best_epoch", losses.index(min(losses)) + 1)}
        out = args.out / folder.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "test_captions.json").write_text(
            json.dumps({video: {"generated": caption} for video, caption in captions.items()}, indent=2) + "\n")
        with_unknown = sum(UNKNOWN in caption.split() for caption in captions.values())
        print(folder, {key: round(value * 100, 1) for key, value in metrics.items()}, "captions with <unk>:", with_unknown)


if __name__ == "__main__":
    main()
