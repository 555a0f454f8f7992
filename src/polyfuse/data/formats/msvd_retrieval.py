"""The shared MSVD subset (``../shared/data/msvd``) as a retrieval corpus of experts.

The folder holds one feature set, ``features_vgg.npz``: ``vgg`` (100, 80, 4096), 80
post-ReLU VGG rows per clip (see its PROVENANCE.md). Two experts are made from it:

* ``vgg_appearance``: the rows averaged over ``steps`` equal groups of consecutive
  frames (80 / steps frames each), (steps, 4096);
* ``vgg_motion``: differences of consecutive appearance steps, (steps - 1, 4096): a
  crude motion stream derived from the same network, not an optical-flow or 3D-CNN
  expert. ``polyfuse extract video`` writes a real motion stream (histograms of
  dense optical flow, docs/CAPTIONING.md); this corpus does not read it yet.

Captions come from ``captions.json``, the split from ``splits.json`` (70 / 10 / 20).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from polyfuse.data.arrays import ArrayTable, NpzArrays
from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus, load_captions
from polyfuse.data.formats.jsonfile import read_json

__all__ = ["load_msvd_retrieval"]


def load_msvd_retrieval(folder: str | Path, *, steps: int = 20) -> tuple[RetrievalCorpus, dict[str, list[str]]]:
    """Return the corpus over all 100 videos and the split ``{"train": [...], "val": ..., "test": ...}``."""
    folder = Path(folder)
    features_path = folder / "features_vgg.npz"
    if not features_path.is_file():
        raise FileNotFoundError(f"{features_path} does not exist (see ../shared/data/msvd/PROVENANCE.md)")
    data = ArrayTable(str(features_path), NpzArrays(features_path))  # sizes checked from the headers
    ids = [str(v) for v in data.get("video_ids", "the video ids")]
    vgg = data.get("vgg", "the VGG features")
    if vgg.ndim != 3 or vgg.shape[0] != len(ids):
        raise ValueError(f"{features_path}: 'vgg' has shape {vgg.shape}, expected ({len(ids)}, frames, d)")
    frames = vgg.shape[1]
    if not 2 <= steps <= frames or frames % steps:
        raise ValueError(f"steps must divide the {frames} frames and be >= 2, got {steps}")
    pooled = torch.from_numpy(vgg.astype(np.float32).reshape(len(ids), steps, frames // steps, -1).mean(axis=2))
    motion = pooled[:, 1:] - pooled[:, :-1]
    all_present = torch.ones(len(ids), dtype=torch.bool)
    experts = {
        "vgg_appearance": ExpertFeatures(
            "vgg_appearance", ids, pooled, torch.ones(pooled.shape[:2], dtype=torch.bool), all_present
        ),
        "vgg_motion": ExpertFeatures(
            "vgg_motion", ids, motion, torch.ones(motion.shape[:2], dtype=torch.bool), all_present.clone()
        ),
    }
    captions = load_captions(folder / "captions.json")
    split = read_json(folder / "splits.json")
    lists = {}
    for name in ("train", "val", "test"):
        if not isinstance(split, dict) or not isinstance(split.get(name), list):
            raise ValueError(f"{folder / 'splits.json'}: expected an object with a list of video ids under {name!r}")
        lists[name] = [str(v) for v in split[name]]
    corpus = RetrievalCorpus.build(experts, captions, ids)
    return corpus, lists
