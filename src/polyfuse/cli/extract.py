"""``polyfuse extract images DIR --out features.h5``: CNN grid features of a folder of images;
``polyfuse extract video DIR --out features.h5``: appearance, motion and audio streams of clips.

A progress bar on stderr when it is a terminal (not with ``--no-progress``); a summary
line on stdout gives the counts, the time and what the file holds."""

from __future__ import annotations

import argparse
import time

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="extract image or video features into a cached HDF5 file",
        description="Features of pre-trained EfficientNet-Lite0 (1280-d) for images (grid "
        "cells) or video clips (per frame, with optical flow and audio streams).",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    images = kinds.add_parser("images", help="a folder of <id>.png / <id>.jpg images")
    images.add_argument("folder", help="folder of images named <integer id>.<ext>")
    images.add_argument("--out", required=True, help="HDF5 file (appended to: resumable, cached by content)")
    images.add_argument("--image-size", type=int, default=224, help="resize to S x S pixels, S a multiple of 32 (default 224: 7 x 7 grid)")
    images.add_argument("--batch-size", type=int, default=32)
    images.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    images.add_argument("--no-progress", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")
    video = kinds.add_parser(
        "video",
        help="a folder of clips (.avi, .mp4, ...): appearance, motion and audio streams",
        description="One HDF5 file: groups appearance (T, 1280), motion (T, 132) and, for clips "
        "with an audio track, audio (T, 2 * n_mels), one float32 dataset per video id "
        "(the file stem). Resumable and cached by content (docs/CAPTIONING.md).",
    )
    video.add_argument("folder", help="folder of clips; a clip's id is its file name without the suffix")
    video.add_argument("--out", required=True, help="HDF5 file (appended to: resumable, cached by content)")
    video.add_argument("--frames", type=int, default=80, help="frames sampled uniformly per clip, T (default 80: the rows per video of the shared MSVD VGG features)")
    video.add_argument("--image-size", type=int, default=224, help="frames resized to S x S pixels for the CNN, S a multiple of 32 (default 224)")
    video.add_argument("--flow-size", type=int, default=128, help="shorter side in pixels of the frames given to optical flow (default 128)")
    video.add_argument("--n-mels", type=int, default=64, help="mel bands of the audio stream (default 64)")
    video.add_argument("--streams", default="appearance,motion,audio", help="comma-separated streams to extract (default all: appearance,motion,audio; audio only exists for clips with an audio track)")
    video.add_argument("--batch-size", type=int, default=16, help="frames per forward pass of the CNN (default 16: peak memory about 0.8 GB at 224 px; 32 needs 1.2 GB)")
    video.add_argument("--threads", type=int, default=None, help="torch, decoder and OpenCV threads (default: their own)")
    video.add_argument("--no-progress", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    # what is skipped is said as it happens (polyfuse.cli.main: one line each, above the
    # bar), and again in the summary
    return _run_video(args) if args.kind == "video" else _run_images(args)


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(str(size) for size in shape)


def _run_images(args: argparse.Namespace) -> int:
    from polyfuse.extract.images import extract_image_features, image_ids_of_folder

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
        f"{len(report.skipped)} skipped in {seconds:.1f} s; in the file (images x cells x values): "
        f"{_shape(report.held)}"
    )
    for path in report.skipped:
        print(f"  skipped: {path}: {report.reasons.get(path, 'cannot decode')}")
    for path, said in report.decoder_warnings.items():
        print(f"  kept, the decoder warned: {path}: {said}")
    return 0


def _run_video(args: argparse.Namespace) -> int:
    from polyfuse.extract.video import VideoSettings, extract_video_features, video_paths_of_folder

    settings = VideoSettings(
        frames=args.frames, image_size=args.image_size, flow_size=args.flow_size, n_mels=args.n_mels
    )
    start = time.perf_counter()
    report = extract_video_features(
        video_paths_of_folder(args.folder),
        args.out,
        settings=settings,
        streams=[name.strip() for name in args.streams.split(",") if name.strip()],
        batch_size=args.batch_size,
        progress=not args.no_progress,
        threads=args.threads,
    )
    seconds = time.perf_counter() - start
    held = ", ".join(f"{name} {_shape(shape)}" for name, shape in report.streams.items()) or "nothing"
    print(
        f"{args.out}: {len(report.computed)} clips computed, {len(report.cached)} cached, "
        f"{len(report.skipped)} skipped in {seconds:.1f} s; in the file (clips x rows x values): {held}"
    )
    for video_id, (decoded, announced) in sorted(report.truncated.items()):
        print(f"  {video_id}: {decoded} of the {announced} frames its header announces were decoded (truncated?)")
    done = len(report.computed) + len(report.cached)
    if report.without_audio:
        print(
            f"  {len(report.without_audio)} of {done} clips have no audio track: "
            "no audio features for them"
        )
    for path in report.skipped:
        print(f"  skipped: {path}: {report.reasons.get(path, 'cannot decode')}")
    return 0
