"""``polyfuse plot``: learning curves of a run; ``polyfuse plot attention``: the attention
of a checkpoint's model, drawn by its task (tabular tasks and retrieval: MAN's marginal
attention over time or BAN's maps for one sample; VQA: BAN's glimpses over the image grid
and the question words; captioning: MAF's attention per generated word; chimera: the
hyperbolic layer's attention over a caption and its video); ``polyfuse plot ranking``: the
top videos of a split for one text query, drawn by the task (retrieval, chimera)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="learning curves, MAN attention over time, BAN bilinear maps (PNG)",
        description=(
            "--run DIR: learning curves from the run's CSV logs. --checkpoint FILE: the attention "
            "of the model for one sample of a split, as its task draws it: sentiment, traits, "
            "classification and retrieval (MAN fusions) MAN's per-modality marginal attention over "
            "time or BAN's bilinear maps; vqa BAN's glimpses over the image and the question; "
            "captioning MAF's attention per generated word; chimera the hyperbolic layer's Lorentz "
            "attention over a caption and its video. plot ranking --checkpoint FILE --query TEXT (or "
            "--caption N): the --top videos of --split for the query, as frames of their clips with their scores "
            "(retrieval, chimera)."
        ),
    )
    parser.add_argument(
        "what", nargs="?", choices=["attention", "ranking"],
        help="attention (the default with --checkpoint): MAN / BAN attention of one sample; for a "
        "VQA checkpoint, each glimpse's bilinear attention over the image grid and the question words. "
        "ranking: the top videos of one query (retrieval and chimera checkpoints)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", dest="run_dir", help="a run directory (learning curves)")
    source.add_argument("--checkpoint", help="a .safetensors checkpoint (attention of one sample)")
    source.add_argument("--captions", metavar="RUN_DIR", help="a captioning run: frames, captions and MAF attention of --video")
    parser.add_argument("--video", help="with --captions or a captioning --checkpoint: the video id "
                        "(default with --checkpoint: the --sample-th video of --split)")
    parser.add_argument("--clips", help="with --captions, a captioning --checkpoint or plot ranking: the folder of "
                        "the clips (<video id>.avi, ...) whose frames are drawn (default: the folder 'clips' in the "
                        "folder of captioning.captions, or in the MSVD folder of retrieval.source / chimera.source)")
    parser.add_argument("--split", default="test", help="split of the sample (default test)")
    parser.add_argument("--sample", type=int, default=0, help="sample index within the split (default 0)")
    parser.add_argument("--data", help="another data source with the same modalities")
    parser.add_argument(
        "--modalities", help="comma-separated arrays of --data standing for the checkpoint's modalities, in order"
    )
    ranking = parser.add_argument_group("plot ranking (task.type retrieval, chimera)")
    query = ranking.add_mutually_exclusive_group()
    query.add_argument("--query", help="free text ranked against the videos of --split")
    query.add_argument("--caption", type=int, help="index of a caption of --split (its own video is marked)")
    ranking.add_argument("--top", type=int, default=5, help="videos shown (default 5)")
    vqa = parser.add_argument_group("VQA checkpoints (task.type vqa)")
    vqa.add_argument("--question-ids", help="comma-separated question ids of the split (default: the --sample-th)")
    vqa.add_argument("--images", help="folder of the split's images (<image id>.png|jpg) drawn under the maps "
                     "(easy-VQA: the installed package's)")
    parser.add_argument("--out", required=True, help="PNG file to write (several VQA questions: OUT_<id>.png)")
    parser.set_defaults(run=run)


def _question_ids(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--question-ids takes comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine import learning_curves

    if args.run_dir:
        if args.what is not None:
            raise ValueError(f"plot {args.what} reads a checkpoint: give --checkpoint FILE (--run draws learning curves)")
        path = learning_curves.plot_learning_curves(args.run_dir, args.out)
        print(f"wrote {path}")
        return 0
    from polyfuse.engine.build import quiet_lightning
    from polyfuse.engine.run import load_model
    from polyfuse.engine.rundir import best_checkpoint
    from polyfuse.tasks.registry import task_spec

    if args.captions and not args.video:
        raise ValueError("--captions needs --video ID")
    quiet_lightning()
    if args.what == "ranking":
        return _ranking(args)
    if args.query is not None or args.caption is not None:
        raise ValueError("--query and --caption go with plot ranking")
    task, extras = load_model(best_checkpoint(Path(args.captions)) if args.captions else args.checkpoint)
    spec = task_spec(extras["config"]["task"]["type"])
    options = {"question_ids": _question_ids(args.question_ids) if args.question_ids else None,
               "images": args.images, "video": args.video, "clips": args.clips}
    given = [name for name, value in options.items() if value is not None]
    foreign = [name for name in given if name not in spec.figure_options]
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags} do(es) not apply to a {spec.name} checkpoint")
    if spec.reads_own_files and (args.data or args.modalities):
        raise ValueError(f"a {spec.name} checkpoint reads the files of its configuration: drop --data / --modalities")
    paths = spec.attention_figures(
        task, extras, Path(args.out), split=args.split, sample=args.sample, source=args.data,
        modalities=args.modalities, **{name: options[name] for name in given},
    )
    for path in paths:
        print(f"wrote {path}")
    return 0


def _ranking(args: argparse.Namespace) -> int:
    """``plot ranking``: the task's ranking figure (:meth:`~polyfuse.tasks.registry.TaskSpec.ranking_figure`)."""
    from polyfuse.engine.run import load_model
    from polyfuse.tasks.registry import task_spec

    if args.captions:
        raise ValueError("plot ranking reads a checkpoint: give --checkpoint FILE, not --captions")
    others = [flag for flag, value in (("--video", args.video), ("--question-ids", args.question_ids),
                                       ("--images", args.images), ("--data", args.data),
                                       ("--modalities", args.modalities)) if value is not None]
    if others:
        raise ValueError(f"{', '.join(others)} do(es) not apply to plot ranking")
    if args.query is None and args.caption is None:
        raise ValueError("plot ranking needs a query: --query TEXT or --caption INDEX")
    task, extras = load_model(args.checkpoint)
    spec = task_spec(extras["config"]["task"]["type"])
    paths, lines = spec.ranking_figure(task, extras, Path(args.out), split=args.split, query=args.query,
                                       caption=args.caption, top=args.top, clips=args.clips)
    for line in lines:
        print(line)
    for path in paths:
        print(f"wrote {path}")
    return 0
