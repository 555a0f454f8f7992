"""``polyfuse plot``: learning curves of a run; ``polyfuse plot attention``: attention of
MAN or BAN for one sample, or of BAN for VQA questions (each glimpse over the image grid
and the question words)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

__all__ = ["add_parser", "run", "sample_title"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="learning curves, MAN attention over time, BAN bilinear maps (PNG)",
        description=(
            "--run DIR: learning curves from the run's CSV logs. --checkpoint FILE: for one "
            "sample of a split, MAN's per-modality marginal attention over time (had mode) or "
            "BAN's bilinear attention maps."
        ),
    )
    parser.add_argument(
        "what", nargs="?", choices=["attention"],
        help="attention (the default with --checkpoint): MAN / BAN attention of one sample; for a "
        "VQA checkpoint, each glimpse's bilinear attention over the image grid and the question words",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", dest="run_dir", help="a run directory (learning curves)")
    source.add_argument("--checkpoint", help="a .safetensors checkpoint (attention of one sample)")
    source.add_argument("--captions", metavar="RUN_DIR", help="a captioning run: frames, captions and MAF attention of --video")
    parser.add_argument("--video", help="with --captions: the video id")
    parser.add_argument("--clips", help="with --captions: folder of <video>.avi (default: clips/ beside the caption file)")
    parser.add_argument("--split", default="test", help="split of the sample (default test)")
    parser.add_argument("--sample", type=int, default=0, help="sample index within the split (default 0)")
    parser.add_argument("--data", help="another data source with the same modalities")
    parser.add_argument(
        "--modalities", help="comma-separated arrays of --data standing for the checkpoint's modalities, in order"
    )
    vqa = parser.add_argument_group("VQA checkpoints (task.type vqa)")
    vqa.add_argument("--question-ids", help="comma-separated question ids of the split (default: the --sample-th)")
    vqa.add_argument("--images", help="folder of the split's images (<image id>.png|jpg) drawn under the maps "
                     "(easy-VQA: the installed package's)")
    parser.add_argument("--out", required=True, help="PNG file to write (several VQA questions: OUT_<id>.png)")
    parser.set_defaults(run=run)


def _short(value) -> str:
    """A tensor value for a title: 3 significant decimals, lists kept short."""
    values = value.reshape(-1).tolist()
    text = ", ".join(f"{v:.3g}" for v in values)
    return text if len(values) == 1 else f"[{text}]"


def _question_ids(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--question-ids takes comma-separated integers, got {text!r}") from None


TITLE_WIDTH = 90


def sample_title(text: str, width: int = TITLE_WIDTH) -> str:
    """A figure title wrapped onto lines of at most ``width`` characters, so that long
    vectors (a traits checkpoint's predictions and labels) are not cut off."""
    return "\n".join(textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False))


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine import plots

    if args.captions:
        from polyfuse.engine.run import load_model
        from polyfuse.tasks.captioning_figure import best_checkpoint, plot_caption_attention

        if not args.video:
            raise ValueError("--captions needs --video ID")
        task, extras = load_model(best_checkpoint(Path(args.captions)))
        print(f"wrote {plot_caption_attention(task, extras, args.video, args.out, clips=args.clips)}")
        return 0
    if args.run_dir:
        if args.what == "attention":
            raise ValueError("plot attention reads a checkpoint: give --checkpoint FILE (--run draws learning curves)")
        path = plots.plot_learning_curves(args.run_dir, args.out)
        print(f"wrote {path}")
        return 0
    from polyfuse.engine.build import quiet_lightning
    from polyfuse.engine.run import apply_checkpoint, load_model
    from polyfuse.figures.attention import draw_ban_maps, draw_man_attention
    from polyfuse.tasks.registry import task_spec

    quiet_lightning()
    task, extras = load_model(args.checkpoint)
    own = task_spec(extras["config"]["task"]["type"]).attention_figures(
        task, extras, args.out, split=args.split, sample=args.sample,
        question_ids=_question_ids(args.question_ids) if args.question_ids else None, images=args.images,
        source=args.data, modalities=args.modalities,
    )
    if own is not None:
        for path in own:
            print(f"wrote {path}")
        return 0
    if args.question_ids or args.images:
        raise ValueError("--question-ids and --images apply to VQA checkpoints only")
    applied = apply_checkpoint(args.checkpoint, split=args.split, source=args.data, modalities=args.modalities,
                               require_labels=False)
    task = applied.module
    batch = applied.data.datamodule.sample(args.split, args.sample)
    attention = plots.attention_for_sample(task, batch)
    row = int(batch["row"][0])
    prediction = _short(task.predictions(task(batch))[0])
    label = "" if "target" not in batch else f", label {_short(batch['target'][0])}"
    title = sample_title(f"{args.split} sample {args.sample} (row {row}): prediction {prediction}{label}")
    centre = int(batch["centre"][0]) if "centre" in batch else None
    if attention["kind"] == "man":
        path = draw_man_attention(attention, args.out, title=title, centre=centre)
    else:
        path = draw_ban_maps(attention, args.out, title=title)
    print(f"wrote {Path(path)}")
    return 0
