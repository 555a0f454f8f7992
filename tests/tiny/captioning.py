"""Tiny captioning files: 12 videos of four kinds (a noun each), an appearance ``.npz``
keyed by video and a motion ``.npz`` with an id column, two captions per video, split
8 / 2 / 2; and the ``task.type captioning`` configuration that reads them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from tests.tiny import TRAINER

#: the noun of each kind of video
WORDS = ["dog", "cat", "car", "man"]


def write_captioning_data(folder: Path, videos: int = 12) -> None:
    """``appearance.npz``, ``motion.npz``, ``captions.json`` and ``splits.json`` (the first 8
    videos train, the next 2 validate, the rest test) in ``folder``."""
    rng = np.random.default_rng(0)
    ids = [f"vid{i:02d}" for i in range(videos)]
    kind = {v: i % len(WORDS) for i, v in enumerate(ids)}
    appearance = {v: (rng.normal(size=(5, 6)) + kind[v]).astype(np.float32) for v in ids}
    np.savez(folder / "appearance.npz", **appearance)
    motion = rng.normal(size=(videos, 4, 3)).astype(np.float16)
    np.savez(folder / "motion.npz", video_ids=np.array(ids), flow=motion)
    captions = {v: [f"A {WORDS[kind[v]]} is here.", f"the {WORDS[kind[v]]} moves"] for v in ids}
    (folder / "captions.json").write_text(json.dumps(captions))
    (folder / "splits.json").write_text(json.dumps({"train": ids[:8], "val": ids[8:10], "test": ids[10:]}))


def captioning_config_file(folder: Path, **captioning) -> Path:
    """``config.yaml`` in ``folder``: a small L-HOCA-UBT decoder over the files of
    :func:`write_captioning_data`, named relative to the configuration; ``captioning``
    overrides keys of the ``captioning`` section."""
    config = {
        "name": "cap",
        "task": {"type": "captioning", "label_smoothing": 0.1},
        "data": {"batch_size": 8, "eval_batch_size": 4},
        "captioning": {"features": {"appearance": "appearance.npz", "motion": "motion.npz#flow"},
                       "captions": "captions.json", "splits": "splits.json", "min_count": 1,
                       "beam_size": 2, "max_length": 6, "meteor": False, **captioning},
        "decoder": {"variant": "L-HOCA-UBT", "feature_dim": 8, "embed_dim": 8, "hidden_dim": 12,
                    "attention_dim": 4, "dropout": 0.0},
        "optim": {"lr": 0.01},
        "trainer": {"max_epochs": 2, "patience": 0, "accelerator": "cpu", "progress_bar": False,
                    "quiet": True, "num_threads": 1},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def captioning_task_config(folder: Path) -> dict:
    """The files and configuration above with absolute paths, decoder dropout 0.2 and the
    tiny trainer section (:data:`tests.tiny.TRAINER`), writing under ``folder / "runs"``."""
    write_captioning_data(folder)
    config = yaml.safe_load(captioning_config_file(folder).read_text())
    for section in ("features",):
        config["captioning"][section] = {k: str(folder / v) for k, v in config["captioning"][section].items()}
    for key in ("captions", "splits"):
        config["captioning"][key] = str(folder / config["captioning"][key])
    config["decoder"]["dropout"] = 0.2
    return {**config, "output_dir": str(folder / "runs"), "trainer": {**config["trainer"], **TRAINER}}
