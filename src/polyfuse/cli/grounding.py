"""``polyfuse grounding``: phrase grounding data in the Flickr30k Entities release's files.

- ``synthetic OUT --images N``: write a small set in the release's exact files
  (``Sentences/``, ``Annotations/``, ``train.txt``, ``val.txt``, ``test.txt``) with region
  features in ban-vqa's adaptive HDF5 layout, whose phrases are learnable from the
  regions (:mod:`polyfuse.data.synthetic_flickr30k`), and print the ``data.grounding``
  section that reads it.

Training, evaluation and prediction go through the engine's commands with a
``task.type: grounding`` configuration (docs/GROUNDING.md)::

    polyfuse grounding synthetic runs/flickr30k_like --images 200
    polyfuse train --config configs/papers/ban/flickr30k.yaml
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "grounding",
        help="phrase grounding data: write a synthetic set in the Flickr30k Entities files",
        description="Write a synthetic set in the files of the Flickr30k Entities release with ban-vqa's "
        "adaptive HDF5 region features. Grounding models are trained, evaluated and applied with polyfuse "
        "train / evaluate / predict and a task.type: grounding configuration (configs/flickr30k/, "
        "docs/GROUNDING.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    synthetic = actions.add_parser(
        "synthetic", help="write a synthetic set in the Flickr30k Entities files (and region features)",
        description="Write Sentences/, Annotations/, train.txt, val.txt, test.txt, features.hdf5 and "
        "features_imgid2idx.json under OUT; phrases are learnable from the regions.",
    )
    synthetic.add_argument("out", help="the folder to write")
    synthetic.add_argument("--images", type=int, required=True, help="images in all (60/20/20 %% train/val/test)")
    synthetic.add_argument("--feature-dim", type=int, default=32, help="features per region (default 32)")
    synthetic.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from polyfuse.data.synthetic_flickr30k import write_flickr30k_like

    if args.images < 3 or args.feature_dim < 1:
        raise ValueError("--images must be at least 3 and --feature-dim at least 1")
    written = write_flickr30k_like(args.out, images=args.images, seed=args.seed, feature_dim=args.feature_dim)
    print(", ".join(f"{len(ids)} {split} images" for split, ids in written.splits.items()) + f" in {written.folder}")
    print("data:\n  grounding:")
    print(f"    entities: {written.folder}\n    features: {written.features}\n    features_index: {written.index}")
    return 0
