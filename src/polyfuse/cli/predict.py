"""``polyfuse predict``: predictions of a checkpoint for the rows of a data source, as CSV
(captioning: JSON ``{video id: caption}``)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="write a checkpoint's predictions (CSV; captioning: JSON)",
        description="Predict every row of a data source (labels optional) with a .safetensors "
        "checkpoint, standardising with the training statistics stored in it. --modalities "
        "names the arrays to use when they are named differently than in training. A VQA "
        "checkpoint answers new questions about new images with --data QUESTIONS.json --images DIR "
        "(docs/VQA.md, 'Using a trained model').",
    )
    parser.add_argument("--checkpoint", required=True, help="a .safetensors checkpoint written by polyfuse train")
    parser.add_argument(
        "--data", help="data source (default: the training one); VQA: a questions JSON about the images of --images"
    )
    parser.add_argument(
        "--images", help="VQA: folder of <image id>.png|jpg (extracted as in training) or features .h5 of --data's images"
    )
    parser.add_argument("--split", default="all", help="all (default) or train, val, test")
    parser.add_argument(
        "--top-k", type=int, default=None, metavar="K",
        help="VQA: the K best answers per question with their sigmoid scores (columns answer_2, score_2, ... "
        "after the best answer's; default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--modalities", help="comma-separated arrays of --data standing for the checkpoint's modalities, in order"
    )
    parser.add_argument("--out", required=True, help="CSV file to write (captioning: JSON {video_id: caption})")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.build import quiet_lightning
    from polyfuse.engine.run import predict

    quiet_lightning()
    # images and questions left out are warnings, said in one line each by polyfuse.cli.main
    records = predict(
        args.checkpoint, source=args.data, split=args.split, out=args.out, modalities=args.modalities,
        images=args.images, top_k=args.top_k,
    )  # fmt: skip
    print(f"wrote {len(records)} predictions to {args.out}")
    return 0
