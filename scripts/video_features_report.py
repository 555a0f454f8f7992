#!/usr/bin/env python
"""What a `polyfuse extract video` file holds, and a check that its features mean something.

    python scripts/video_features_report.py FEATURES.h5 [--vgg features_vgg.npz]

Prints the clips, streams, shapes and bytes of the file, the range of each stream, and
a sanity check on real clips: clips cut from one YouTube video (ids
``<youtube id>_<start>_<end>``) should be near neighbours. For each clip that has such a
sibling, the rank of the sibling among all other clips by the cosine of the clips'
mean feature (1 = nearest), per stream, and for the VGG rows of the npz when given.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np


def sibling_ranks(means: dict[str, np.ndarray]) -> dict[str, int]:
    """``{clip: rank of its nearest sibling}`` by the cosine of ``{clip: mean feature}``."""
    ids = sorted(means)
    matrix = np.stack([means[i] for i in ids]).astype(np.float64)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True) + 1e-12
    cosine = matrix @ matrix.T
    groups: dict[str, list[int]] = defaultdict(list)
    for row, video_id in enumerate(ids):
        groups[video_id.rsplit("_", 2)[0]].append(row)
    ranks = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for row in members:
            others = np.delete(np.arange(len(ids)), row)
            order = others[np.argsort(-cosine[row, others], kind="stable")]
            ranks[ids[row]] = 1 + min(int(np.flatnonzero(order == m)[0]) for m in members if m != row)
    return ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("features", type=Path)
    parser.add_argument("--vgg", type=Path, help="features_vgg.npz of the shared MSVD folder")
    args = parser.parse_args(argv)
    print(f"{args.features}: {args.features.stat().st_size:,} bytes")
    streams: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(args.features) as handle:
        print("settings: " + ", ".join(f"{k}={handle.attrs[k]}" for k in ("frames", "image_size", "flow_size", "n_mels")))
        for name in handle:
            streams[name] = {video_id: data[...] for video_id, data in handle[name].items()}
            values = np.concatenate([v.ravel() for v in streams[name].values()])
            shapes = {v.shape for v in streams[name].values()}
            print(f"{name}: {len(streams[name])} clips, shapes {sorted(shapes)}, "
                  f"{values.nbytes:,} bytes of float32, values {values.min():.4g} to {values.max():.4g}, "
                  f"mean {values.mean():.4g}, {100 * np.mean(values == 0):.1f}% zeros")
    tables = {name: {i: v.mean(axis=0) for i, v in data.items()} for name, data in streams.items()}
    if args.vgg:
        archive = np.load(args.vgg)
        clips = set(next(iter(streams.values())))
        tables["vgg (npz)"] = {str(i): v.astype(np.float32).mean(axis=0)
                               for i, v in zip(archive["video_ids"], archive["vgg"], strict=True) if str(i) in clips}
    print("\nsibling clips (same YouTube video): rank of the nearest sibling by cosine of the mean feature")
    for name, means in tables.items():
        ranks = sibling_ranks(means)
        if not ranks:
            print(f"{name}: no clip has a sibling")
            continue
        shown = ", ".join(f"{i} {r}" for i, r in sorted(ranks.items()))
        print(f"{name} (among {len(means) - 1} others): {shown}; median {np.median(list(ranks.values())):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
