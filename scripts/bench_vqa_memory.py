#!/usr/bin/env python
"""Peak memory of ``polyfuse train`` on VQA-2.0-shaped data at several sizes (issue 39's
target: at most 10% more from 4,000 to 16,000 images, under 2 GB at 16,000).

    python scripts/bench_vqa_memory.py --images 4000,16000 --folder /path/with/disk [--steps 200]

For each size, in a fresh process: ``polyfuse vqa synthetic``'s data (the official
question and annotation JSONs, five questions per image, 10 to 100 boxes of 2,048-d
features per image in ban-vqa's adaptive HDF5 layout with a JSON index; about 450 KB of
features per image on disk), then ``polyfuse.engine.train`` on it with a small BAN (the
data, not the model, is measured) for ``--steps`` training steps, its validation (2% of the training images), and
the test pass of the best checkpoint. The process's peak resident memory is read from
``getrusage`` after the run. Data already written in ``--folder`` is reused.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _config(folder: Path, images: int) -> dict:
    data = folder / f"n{images}"
    files = {f"{split}_{kind}": str(data / name) for split, part in (("train", "train"), ("test", "val"))
             for kind, name in (("questions", f"v2_OpenEnded_mscoco_{part}2014_questions.json"),
                                ("annotations", f"v2_mscoco_{part}2014_annotations.json"))}
    features = {f"{split}_features": str(data / f"{part}.hdf5") for split, part in (("train", "train"), ("test", "val"))}
    index = {f"{split}_features_index": str(data / f"{part}_imgid2idx.json") for split, part in (("train", "train"), ("test", "val"))}
    return {
        "task": {"type": "vqa"}, "seed": 0, "output_dir": str(folder / "runs"),
        "data": {"batch_size": 32, "eval_batch_size": 32, "loader_workers": 0, "validation_fraction": 0.02,
                 "vqa": {**files, **features, **index, "min_answer_count": 1}},
        "model": {"fusion": "ban", "vqa": {"hidden_dim": 64, "embedding_dim": 32}, "options": {"ban": {"glimpses": 2}}},
        "trainer": {"max_epochs": 1, "progress_bar": False, "quiet": True},
    }


def _measure(folder: Path, images: int, steps: int) -> dict:
    """In this process: write the data if needed, train, and report the peak memory."""
    from lightning.pytorch.callbacks import Callback

    from polyfuse.data.synthetic_vqa import write_vqa2_like
    from polyfuse.engine import train

    data = folder / f"n{images}"
    if not (data / "val_imgid2idx.json").is_file():
        write_vqa2_like(data, images={"train": images, "val": 500}, feature_dim=2048, min_boxes=10, max_boxes=100,
                        splits=("train", "val"), formats=("hdf5",), seed=0)

    class StopAfter(Callback):  # an epoch of ``steps`` batches, then validation as usual
        def setup(self, trainer, module, stage):
            trainer.limit_train_batches = steps

    start = time.perf_counter()
    result = train(_config(folder, images), run_dir=folder / "runs" / f"n{images}_{int(time.time())}",
                   callbacks=[StopAfter()])
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before anything else is read
    questions = len(json.loads((data / "v2_mscoco_train2014_annotations.json").read_text())["annotations"])
    return {"images": images, "questions": questions, "steps": steps,
            "features_bytes": (data / "train.hdf5").stat().st_size, "peak_rss_mib": peak_mib,
            "seconds": round(time.perf_counter() - start, 1), "test": result.test}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="4000,16000", help="training images, comma-separated")
    parser.add_argument("--folder", type=Path, required=True, help="where the data are written (about 0.5 MB per image)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the measuring process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(_measure(args.folder, args.one, args.steps)))
        return 0
    rows = []
    for images in (int(n) for n in args.images.split(",")):
        done = subprocess.run([sys.executable, __file__, "--folder", str(args.folder), "--steps", str(args.steps),
                               "--one", str(images)], check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| training images | questions | features on disk | peak RSS | training steps | run time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['images']:,} | {row['questions']:,} | {row['features_bytes'] / 2**30:.2f} GiB | "
              f"{row['peak_rss_mib']:,.0f} MiB | {row['steps']} | {row['seconds']:.0f} s |")
    first, last = rows[0], rows[-1]
    print(f"\npeak RSS grows by {100 * (last['peak_rss_mib'] / first['peak_rss_mib'] - 1):+.1f}% from "
          f"{first['images']:,} to {last['images']:,} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
