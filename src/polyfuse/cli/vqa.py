"""``polyfuse vqa``: VQA data in the official formats.

- ``import-easy-vqa OUT``: write easy-VQA in the VQA 2.0 JSON format;
- ``import-bottom-up TSV --out H5``: convert the bottom-up-attention release's region
  features (TSV) to ban-vqa's adaptive HDF5 layout and its JSON image-id index
  (streaming and resumable: rerun the same command after an interruption or a fixed
  line; :mod:`polyfuse.data.formats.bottom_up_tsv`);
- ``synthetic OUT --images N``: write a synthetic set shaped like VQA 2.0 (questions and
  annotations JSON, features as the bottom-up TSV and/or the adaptive HDF5) whose answers
  are learnable from the regions (:mod:`polyfuse.data.synthetic_vqa`).

Training, evaluation, comparison and attention figures of VQA models go through the
engine's commands with a ``task.type: vqa`` configuration (docs/VQA.md)::

    polyfuse extract images <easy_vqa>/data/train/images --out runs/easyvqa/train_128.h5 --image-size 128
    polyfuse extract images <easy_vqa>/data/test/images --out runs/easyvqa/test_128.h5 --image-size 128
    polyfuse train --config configs/easy_vqa/ban.yaml
    polyfuse compare --config configs/easy_vqa/ban.yaml --models ban,configs/easy_vqa/ban_nocount.yaml,concat,lmf,man --seeds 3
    polyfuse plot attention --checkpoint RUN/checkpoints/best.safetensors --question-ids 0,5 --out attention.png
    polyfuse vqa import-bottom-up trainval_resnet101_faster_rcnn_genome.tsv --out data/train.hdf5
    polyfuse vqa synthetic runs/vqa2like --images 2000
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "vqa",
        help="visual question answering data: import easy-VQA or bottom-up features, write a synthetic VQA 2.0",
        description="Write easy-VQA in the VQA 2.0 JSON format, convert bottom-up region features "
        "(TSV) to ban-vqa's adaptive HDF5, or write a synthetic set in the VQA 2.0 formats. VQA "
        "models are trained, compared and inspected with polyfuse train / evaluate / predict / "
        "compare / plot and a task.type: vqa configuration (configs/easy_vqa/, docs/VQA.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    importer = actions.add_parser(
        "import-easy-vqa", help="write easy-VQA in the VQA 2.0 JSON format"
    )
    importer.add_argument("out", help="folder for {train,test}_{questions,annotations}.json")
    importer.add_argument(
        "--limit", type=int, default=None, help="keep the first LIMIT image ids of each split"
    )
    bottom_up = actions.add_parser(
        "import-bottom-up",
        help="convert bottom-up-attention region features (TSV) to ban-vqa's adaptive HDF5 (resumable)",
        description="Convert the TSV of the bottom-up-attention release (image_id, image_w, image_h, "
        "num_boxes, base64 boxes, base64 features per line) to ban-vqa's adaptive HDF5 layout "
        "(image_features, spatial_features, image_bb, pos_boxes) and a JSON image-id index. The "
        "conversion streams; rerun the same command after an interruption (or after fixing the "
        "line a bad input stopped at) and it resumes where it stopped.",
    )
    bottom_up.add_argument("tsv", help="the bottom-up TSV file")
    bottom_up.add_argument(
        "--out", required=True, help="the HDF5 file to write (e.g. data/train.hdf5)"
    )
    bottom_up.add_argument(
        "--index",
        default=None,
        help="the JSON image-id index (default: beside --out, train.hdf5 -> train_imgid2idx.json)",
    )
    bottom_up.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an --out file of another input instead of refusing it",
    )
    bottom_up.add_argument("--no-progress", action="store_true", help="no progress bar")
    synthetic = actions.add_parser(
        "synthetic",
        help="write a synthetic set in the VQA 2.0 formats (questions, annotations, region features)",
        description="Write a synthetic set shaped like VQA 2.0: for each split the official questions "
        "and annotations JSON and region features as the bottom-up TSV ({split}.tsv) and/or ban-vqa's "
        "adaptive HDF5 ({split}.hdf5, {split}_imgid2idx.json). Answers are learnable from the regions.",
    )
    synthetic.add_argument("out", help="the folder to write")
    synthetic.add_argument(
        "--images", type=int, required=True, help="images per split (train and val)"
    )
    synthetic.add_argument(
        "--questions-per-image", type=int, default=5, help="questions per image (default 5)"
    )
    synthetic.add_argument(
        "--feature-dim", type=int, default=2048, help="features per region (default 2048)"
    )
    synthetic.add_argument(
        "--min-boxes", type=int, default=10, help="fewest regions of an image (default 10)"
    )
    synthetic.add_argument(
        "--max-boxes", type=int, default=100, help="most regions of an image (default 100)"
    )
    synthetic.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synthetic.add_argument(
        "--formats", default="tsv,hdf5", help="feature files to write: tsv, hdf5 or both (default)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "import-bottom-up":
        from polyfuse.data.formats.bottom_up_tsv import import_bottom_up

        summary = import_bottom_up(
            args.tsv,
            args.out,
            index_path=args.index,
            progress=not args.no_progress,
            overwrite=args.overwrite,
        )
        print("\n".join(summary.lines()))
        return 0
    if args.action == "synthetic":
        from polyfuse.data.synthetic_vqa import write_vqa2_like

        formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
        written = write_vqa2_like(
            args.out,
            images=args.images,
            questions_per_image=args.questions_per_image,
            feature_dim=args.feature_dim,
            min_boxes=args.min_boxes,
            max_boxes=args.max_boxes,
            seed=args.seed,
            formats=formats,
        )
        for split, paths in written.items():
            print(f"{split}: " + ", ".join(str(path) for path in paths.values()))
        return 0
    from polyfuse.data.formats.easy_vqa import import_easy_vqa

    result = import_easy_vqa(args.out, limit=args.limit)
    for split, paths in result.items():
        print(f"{split}: {paths['questions']}, {paths['annotations']}; images in {paths['images']}")
    return 0
