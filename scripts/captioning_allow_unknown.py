"""Decode captioning runs again with ``<unk>`` allowed (same weights) and score them.

``captioning.allow_unknown`` only changes decoding, so its effect is measured on the
trained checkpoints themselves (docs/RESULTS.md, "Why the 0.3.0 defaults score lower"):

    PYTHONPATH=src python scripts/captioning_allow_unknown.py --out runs/ablate/unk/hoca_b \\
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
from polyfuse.engine import captioning_runs as cr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for folder in args.runs:
        checkpoint = folder / "checkpoints/best.safetensors"
        task, extras = cr.load_captioning_model(checkpoint)
        task.allow_unknown = True
        data = cr._data_for(extras)
        task.references = data.captions
        module = cr.CaptioningDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
        videos = cr._videos(data, "test")
        trainer = cr._quiet_trainer(extras["config"])
        metrics = cr._metrics(trainer.test(task, dataloaders=module.video_loader(videos), verbose=False), "test")
        with torch.no_grad():
            outputs = cr._quiet_trainer(extras["config"]).predict(task, dataloaders=module.video_loader(videos))
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
