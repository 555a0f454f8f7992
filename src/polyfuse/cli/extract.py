"""``polyfuse extract images DIR --out features.h5``: CNN grid features of a folder of images."""

from __future__ import annotations

import argparse
import time

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="extract image features into a cached HDF5 file",
        description="Grid features of pre-trained EfficientNet-Lite0 (1280-d, S/32 x S/32 cells).",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    images = kinds.add_parser("images", help="a folder of <id>.png / <id>.jpg images")
    images.add_argument("folder", help="folder of images named <integer id>.<ext>")
    images.add_argument("--out", required=True, help="HDF5 file (appended to: resumable, cached by content)")
    images.add_argument("--image-size", type=int, default=224, help="resize to S x S pixels, S a multiple of 32 (default 224: 7 x 7 grid)")
    images.add_argument("--batch-size", type=int, default=32)
    images.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    images.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from polyfuse.extract.images import extract_image_features, image_ids_of_folder

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    report = extract_image_features(
        image_ids_of_folder(args.folder),
        args.out,
        image_size=args.image_size,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    seconds = time.perf_counter() - start
    print(
        f"{args.out}: {report.computed} images computed, {report.cached} cached, "
        f"{len(report.skipped)} skipped (cannot decode) in {seconds:.1f} s"
    )
    for path in report.skipped:
        print(f"  skipped: {path}")
    return 0
