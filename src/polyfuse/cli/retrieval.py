"""``polyfuse retrieval train|compare|chimera|evaluate|table|figure``: kept for 0.3.x as a thin alias.

Retrieval over experts and Chimera are task types of the one engine (``task.type:
retrieval`` / ``chimera``; configs/msvd/retrieval/, configs/msvd/chimera/). ``train``,
``compare`` and ``chimera`` build the equivalent configuration, write it beside the runs
(``<out>/<label>.yaml``), run ``polyfuse train`` on it once per seed (run directories
``<out>/[<label>/]seed<N>``) and say which ``polyfuse train --config`` to use instead.
``evaluate`` and ``figure`` read a run's ``checkpoints/best.safetensors``; a pickled
``.pt`` of an older polyfuse is refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# polyfuse.nn.models.retrieval.VIDEO_FUSIONS, written out: the parser must not import torch
FUSIONS = ("man", "concat", "mean", "gating", "gating+man", "mean+man")
PRECISIONS = ("32-true", "bf16-mixed")
#: the columns of the tables (docs/RESULTS.md)
METRIC_COLUMNS = ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR", "v2t_R@1", "v2t_R@5", "v2t_R@10", "v2t_MedR")
_PRECISION_HELP = "32-true (default) or bf16-mixed (trainer.precision)"

__all__ = ["add_parser", "alias_config", "metrics_table", "run"]


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="the MSVD folder (../shared/data/msvd), or synthetic:videos=N,experts=m,"
                        "steps=S,dim=D,events=E,noise=X,seed=K (planted events; use --text bow)")
    parser.add_argument("--expert", action="append", metavar="NAME=PATH",
                        help="an expert file (.npz or .h5; repeat per expert), instead of --data")
    parser.add_argument("--captions", help="captions JSON {video_id: [caption, ...]} (with --expert)")
    for name in ("train", "val", "test"):
        parser.add_argument(f"--{name}-ids", help=f"{name} video ids, one per line (with --expert)")
    parser.add_argument("--text", default="minilm",
                        help="'minilm' (default), a GloVe-format vectors file, or 'bow' (word counts, for synthetic data)")


def _size(text: str) -> int:
    """A layer size or count: an integer in [1, MAX_SIZE] (polyfuse.sizes)."""
    from polyfuse.sizes import MAX_SIZE

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= value <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{value} lies outside [1, {MAX_SIZE}]")
    return value


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed (default 0 1 2)")
    parser.add_argument("--epochs", type=int, default=30, help="trainer.max_epochs (default 30)")
    parser.add_argument("--batch-size", type=_size, default=32, help="data.batch_size: distinct videos per batch (default 32)")
    parser.add_argument("--lr", type=float, default=1e-3, help="optim.lr (default 1e-3)")
    parser.add_argument("--embed-dim", type=_size, default=256, help="retrieval.embed_dim (default 256)")
    parser.add_argument("--hidden-dim", type=_size, default=64, help="retrieval.hidden_dim (default 64)")
    parser.add_argument("--loss", choices=("margin", "infonce"), default="margin", help="retrieval.loss (default margin)")
    parser.add_argument("--margin", type=float, default=0.2, help="retrieval.margin (default 0.2)")
    parser.add_argument("--text-lr", type=float, default=None,
                        help="retrieval.text_lr: fine-tune the text encoder at this rate (default: frozen)")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true", help=_PRECISION_HELP)
    man = parser.add_argument_group("MAN (fusions man, gating+man, mean+man; model.options.man)")
    man.add_argument("--man-heads", type=_size, default=None, help="heads (default 4; the paper's retrieval: 8)")
    man.add_argument("--man-random-features", type=_size, default=None,
                     help="random features per head of had mode (default 64; the paper: 512)")
    man.add_argument("--man-chunks", type=int, default=None, help="LSC chunks (default 4; the paper: 10)")
    man.add_argument("--man-layer-norm", action=argparse.BooleanOptionalAction, default=None,
                     help="retrieval.man_layer_norm (default: on for gating+man and mean+man, off for man)")
    man.add_argument("--man-zero-init", action=argparse.BooleanOptionalAction, default=None,
                     help="retrieval.man_zero_init: mean+man's MAN branch starts at zero (default on)")
    man.add_argument("--man-lr", type=float, default=None,
                     help="retrieval.man_lr: gating+man, mean+man: learning rate of MAN's video branch (default: --lr)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "retrieval", help="text-video retrieval (kept for 0.3.x: use polyfuse train with a task.type retrieval config)",
        description="Kept for 0.3.x as a thin alias: each action writes the equivalent configuration "
        "(task.type retrieval or chimera) and runs polyfuse train / evaluate on it, and says which command to "
        "use instead: polyfuse train --config configs/msvd/retrieval/<fusion>.yaml, "
        "configs/msvd/chimera/<row>.yaml; polyfuse compare over seeds.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train one video fusion over seeds (polyfuse train per seed)")
    _data_arguments(train)
    _train_arguments(train)
    train.add_argument("--fusion", choices=FUSIONS, default="man", help="retrieval.fusion (default man)")
    train.add_argument("--out", required=True, help="parent of the run directories seed<N>")
    compare = actions.add_parser("compare", help="train several fusions; print a markdown table")
    _data_arguments(compare)
    _train_arguments(compare)
    compare.add_argument("--fusions", nargs="+", default=["man", "concat", "mean"], choices=FUSIONS)
    compare.add_argument("--out", required=True, help="parent directory; <out>/<fusion>/seed<N> per run")
    chimera = actions.add_parser("chimera", help="Chimera ablation rows (Table 4) on MiniLM + video; EX1 and EX2")
    _data_arguments(chimera)
    chimera.add_argument("--rows", nargs="+", default=None,
                         help="ablation rows (default: the ten of Table 4; Z20-af-N20-HLM-LD-noLT is the first without L_T)")
    chimera.add_argument("--seeds", type=int, nargs="+", default=[0], help="default 0")
    chimera.add_argument("--epochs", type=int, default=10, help="trainer.max_epochs (default 10)")
    chimera.add_argument("--patience", type=int, default=None,
                         help="trainer.patience: stop after this many epochs without a better val/rsum (default: none)")
    chimera.add_argument("--batch-size", type=_size, default=16, help="default 16")
    chimera.add_argument("--lr", type=float, default=1e-3, help="default 1e-3")
    chimera.add_argument("--scalar-lr", type=float, default=None,
                         help="chimera.scalar_lr: learning rate of omega_t, omega_v, beta, c (default: --lr)")
    chimera.add_argument("--tlm-temperature", type=float, default=1.0,
                         help="chimera.tlm_temperature: divisor of L_TLM's inner products (default 1, the paper's)")
    chimera.add_argument("--mask-rate", type=float, default=0.2,
                         help="chimera.mask_rate: share of word pieces and video steps masked per step (default 0.2)")
    chimera.add_argument("--chimera-expert", default=None,
                         help="chimera.expert (default: the corpus's first, MSVD's vgg_appearance)")
    chimera.add_argument("--precision", choices=PRECISIONS, default="32-true", help=_PRECISION_HELP)
    chimera.add_argument("--out", required=True, help="parent directory; <out>/<row>/seed<N> per run")
    table = actions.add_parser("table", help="markdown tables (EX1, EX2) from run directories")
    table.add_argument("runs", nargs="+",
                       help="run directories (or their results.json); runs under one parent folder are seeds of one row")
    evaluate = actions.add_parser("evaluate", help="test metrics of a run's checkpoint")
    _data_arguments(evaluate)  # read only for a seed<N>.safetensors of an older polyfuse
    evaluate.add_argument("--checkpoint", required=True, help="a run directory or its checkpoints/best.safetensors")
    evaluate.add_argument("--split", default="test", help="train | valid | test (default test)")
    evaluate.add_argument("--shuffle-words", action="store_true", help="shuffle each query's words (EX2)")
    figure = actions.add_parser("figure", help="top videos of one query as frame thumbnails with scores (PNG)")
    _data_arguments(figure)  # read only for a seed<N>.safetensors of an older polyfuse
    figure.add_argument("--checkpoint", required=True, help="a run directory or checkpoint of task.type retrieval")
    query = figure.add_mutually_exclusive_group(required=True)
    query.add_argument("--query", help="free text")
    query.add_argument("--caption", type=int, help="index of a caption of the split (its video is marked correct)")
    figure.add_argument("--clips", help="folder of the clips, one file per video id (default: <source>/clips)")
    figure.add_argument("--split", default="test")
    figure.add_argument("--top", type=int, default=5)
    figure.add_argument("--out", required=True, help="PNG path")
    parser.set_defaults(run=run)


# ---- configurations --------------------------------------------------------------------
def _source(args: argparse.Namespace) -> dict[str, Any]:
    """The corpus keys of a ``retrieval`` / ``chimera`` section, paths made absolute."""
    if args.data is not None:
        is_path = not args.data.startswith("synthetic")
        return {"source": str(Path(args.data).resolve()) if is_path else args.data, "experts": None,
                "captions": None, "splits": None}
    if not args.expert or not args.captions or not all(getattr(args, f"{n}_ids") for n in ("train", "val", "test")):
        raise ValueError("give --data (MSVD folder) or --expert NAME=PATH ... --captions FILE --train-ids ... "
                         "--val-ids ... --test-ids ...")
    experts = {}
    for spec in args.expert:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"--expert takes NAME=PATH, got {spec!r}")
        experts[name] = str(Path(path).resolve())
    return {"source": None, "experts": experts, "captions": str(Path(args.captions).resolve()),
            "splits": {n: str(Path(getattr(args, f"{n}_ids")).resolve()) for n in ("train", "val", "test")}}


def alias_config(args: argparse.Namespace, *, fusion: str | None = None, row: str | None = None) -> dict[str, Any]:
    """The ``polyfuse train`` configuration of ``polyfuse retrieval train|compare`` (``fusion``)
    or ``chimera`` (``row``), without a seed (set per run)."""
    trainer = {"max_epochs": args.epochs, "patience": getattr(args, "patience", None) or 0,
               "precision": args.precision, "accelerator": "cpu", "quiet": True}  # progress bars, not Lightning's notices
    # output_dir: where the caches go (<out>/../.cache, named by content, as before)
    config: dict[str, Any] = {"data": {"batch_size": args.batch_size}, "optim": {"lr": args.lr, "weight_decay": 1e-4},
                              "trainer": trainer, "output_dir": str(Path(args.out).resolve().parent)}
    if row is not None:
        from polyfuse.tasks.chimera.spec import ABLATION_ROWS

        if row not in ABLATION_ROWS:
            raise ValueError(f"unknown ablation row {row!r}; available: {', '.join(ABLATION_ROWS)}")
        if args.text != "minilm":
            raise ValueError("retrieval chimera reads MiniLM's token states: drop --text")
        section = {**_source(args), **ABLATION_ROWS[row], "expert": args.chimera_expert, "mask_rate": args.mask_rate,
                   "scalar_lr": args.scalar_lr, "tlm_temperature": args.tlm_temperature}
        return {"name": row, "task": {"type": "chimera"}, "chimera": section, **config}
    text = args.text if args.text in ("minilm", "bow") else "glove"
    section = {**_source(args), "fusion": fusion, "text": text, "embed_dim": args.embed_dim,
               "hidden_dim": args.hidden_dim, "loss": args.loss, "margin": args.margin, "text_lr": args.text_lr,
               "man_layer_norm": args.man_layer_norm}
    if text == "glove":
        section["word_vectors"] = str(Path(args.text).resolve())
    if fusion == "mean+man":
        section["man_zero_init"] = args.man_zero_init
    if fusion in ("gating+man", "mean+man"):
        section["man_lr"] = args.man_lr
    man = {"heads": args.man_heads, "num_random_features": args.man_random_features, "chunks": args.man_chunks}
    man = {k: v for k, v in man.items() if v is not None}
    if man and "man" in fusion.split("+"):
        config["model"] = {"options": {"man": man}}
    return {"name": fusion, "task": {"type": "retrieval"}, "retrieval": section, **config}


def _train_seeds(config: dict[str, Any], seeds: list[int], out: Path) -> list[Path]:
    """Write ``config`` to ``<out>.yaml`` and run ``polyfuse train`` on it per seed
    (``<out>/seed<N>``); print which command does the same."""
    from polyfuse.engine.config import dump_config
    from polyfuse.engine.run import train
    from polyfuse.engine.rundir import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    config_path = out.parent / f"{out.name}.yaml"
    atomic_write_text(config_path, dump_config(config))
    print(f"note: `polyfuse retrieval` is kept for 0.3.x; the same runs: polyfuse train --config {config_path} "
          f"--set seed=N --out {out}/seedN (shipped configs: configs/msvd/retrieval/, configs/msvd/chimera/)")
    runs = []
    for seed in seeds:
        result = train({**config, "seed": seed}, run_dir=out / f"seed{seed}")
        runs.append(Path(result.run_dir))
    return runs


# ---- tables ---------------------------------------------------------------------------
def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def _results_of(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(row label, results.json) of a run directory or its results.json; the label is the
    run directory's parent folder (``<out>/<fusion or row>/seed<N>``)."""
    from polyfuse.data.formats.jsonfile import read_json

    path = Path(path)
    run_dir = path.parent if path.name == "results.json" else path
    results = read_json(run_dir / "results.json")
    if not isinstance(results, dict) or not isinstance(results.get("test"), dict) or not results["test"]:
        raise ValueError(f"{run_dir}: not a run of polyfuse train with test metrics (results.json of an older "
                         "`polyfuse retrieval` is not read: rerun it)")
    return run_dir.resolve().parent.name, results


def metrics_table(rows: dict[str, list[dict[str, Any]]], key: str = "test") -> str:
    """Markdown: one row per label, mean ± std over its runs; chance and (synthetic) bounds first."""
    header = "| model | " + " | ".join(METRIC_COLUMNS) + " | train s/seed |"
    lines = [header, "|" + "---|" * (len(METRIC_COLUMNS) + 2)]
    first = next(iter(rows.values()))[0]
    chance = [f"{first['test']['chance_' + c]:.1f}" if "R@" in c and "chance_" + c in first["test"] else "-"
              for c in METRIC_COLUMNS]
    lines.append("| chance | " + " | ".join(chance) + " | - |")
    references = first.get("references", {})
    for prefix, label in (("caption_", "bound: perfect caption match"), ("events_", "bound: events known, relation not")):
        if any(name.startswith(prefix) for name in references):
            cells = [f"{references[prefix + c[4:]]:.1f}" if c.startswith("t2v_R@") else "-" for c in METRIC_COLUMNS]
            lines.append(f"| {label} | " + " | ".join(cells) + " | - |")
    for name, runs in rows.items():
        if any(key not in r for r in runs):
            continue
        cells = [_mean_std([r[key][c] for r in runs]) for c in METRIC_COLUMNS]
        seconds = statistics.mean(r["train_seconds"] for r in runs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    return "\n".join(lines)


def _print_tables(paths: list[str | Path]) -> None:
    rows: dict[str, list[dict[str, Any]]] = {}
    seen: dict[Path, str] = {}
    for path in paths:
        resolved = Path(path).resolve()
        resolved = resolved.parent if resolved.name == "results.json" else resolved
        if resolved in seen:
            raise ValueError(f"{path}: the run {resolved} is given twice")
        seen[resolved] = str(path)
        label, results = _results_of(path)
        rows.setdefault(label, []).append(results)
    print("EX1 (captions as written)\n" + metrics_table(rows))
    print("\nEX2 (words of each caption shuffled)\n" + metrics_table(rows, "test_shuffled_words"))


# ---- checkpoints ----------------------------------------------------------------------------
def _checkpoint_path(given: str) -> Path:
    path = Path(given)
    if path.is_dir():
        path = path / "checkpoints" / "best.safetensors"
    if path.suffix != ".safetensors":
        raise ValueError(
            f"{given}: pickled checkpoints (.pt, written by an older `polyfuse retrieval`) are never loaded, as "
            "unpickling can run code; retrain with `polyfuse train --config configs/msvd/retrieval/<fusion>.yaml` "
            "(or `polyfuse retrieval train ...`, which writes safetensors run directories)")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def _load(args: argparse.Namespace):
    """(spec, module, extras) of a task.type retrieval / chimera checkpoint, or of a
    ``seed<N>.safetensors`` of an older ``polyfuse retrieval train`` (its data then from
    the command's --data / --expert arguments)."""
    from polyfuse.engine.checkpoints import check_extras, read_checkpoint
    from polyfuse.tasks.registry import task_spec

    path = _checkpoint_path(args.checkpoint)
    checkpoint = read_checkpoint(path)
    if "polyfuse" not in checkpoint and checkpoint.get("kind") == "chimera":
        raise ValueError(f"{path}: a Chimera model of an older `polyfuse retrieval chimera`; retrain it with "
                         "`polyfuse train --config configs/msvd/chimera/<row>.yaml`")
    if "polyfuse" not in checkpoint and "settings" in checkpoint:
        from polyfuse.tasks.retrieval.spec import legacy_checkpoint

        state, extras = legacy_checkpoint(checkpoint, str(path))
        section = extras["config"]["retrieval"]
        section.update(_source(args))
        spec = task_spec("retrieval")
        return spec, spec.load_module(state, extras, None), extras
    extras = checkpoint.get("polyfuse")
    check_extras(extras, path)
    kind = extras["config"]["task"]["type"]
    if kind not in ("retrieval", "chimera"):
        raise ValueError(f"{path}: a checkpoint of task.type {kind}; `polyfuse evaluate` applies it")
    spec = task_spec(kind)
    return spec, spec.load_module(checkpoint["state_dict"], extras, checkpoint), extras


def run(args: argparse.Namespace) -> int:
    if args.action == "table":
        _print_tables(args.runs)
        return 0
    if args.action in ("train", "compare", "chimera"):
        out = Path(args.out)
        if args.action == "train":
            runs = _train_seeds(alias_config(args, fusion=args.fusion), args.seeds, out)
        elif args.action == "compare":
            runs = [r for fusion in args.fusions
                    for r in _train_seeds(alias_config(args, fusion=fusion), args.seeds, out / fusion)]
        else:
            from polyfuse.tasks.chimera.spec import TABLE4_ROWS

            runs = [r for row in args.rows or TABLE4_ROWS
                    for r in _train_seeds(alias_config(args, row=row), args.seeds, out / row)]
        if args.action == "train":  # label the rows by the fusion, not by the --out folder
            rows = {args.fusion: [_results_of(r)[1] for r in runs]}
            print("EX1 (captions as written)\n" + metrics_table(rows))
        else:
            _print_tables(runs)
        return 0
    spec, module, extras = _load(args)
    if args.action == "figure":
        return _figure(args, spec, module, extras)
    data = spec.checkpoint_data(extras, split=args.split, shuffle_words=args.shuffle_words)
    print(json.dumps(module.evaluate(spec.loader(data, args.split)), indent=1))
    return 0


def _figure(args: argparse.Namespace, spec, module, extras) -> int:
    from polyfuse.extract.video import video_paths_of_folder
    from polyfuse.tasks.retrieval.figure import draw_ranking, rank_videos

    if extras["config"]["task"]["type"] != "retrieval":
        raise ValueError("`figure` draws the rankings of task.type retrieval models, not of Chimera's")
    data = spec.checkpoint_data(extras, split=args.split)
    part = data.prepared.parts[data.split_part]
    if args.caption is not None:
        if not 0 <= args.caption < len(part.captions):
            raise ValueError(f"--caption {args.caption}: the {args.split} split has captions 0 to {len(part.captions) - 1}")
        query, correct, vector = part.captions[args.caption], part.caption_video[args.caption], None
        if data.prepared.vectors.get(data.split_part) is not None:
            vector = data.prepared.vectors[data.split_part][args.caption : args.caption + 1]
    else:
        if not args.query.strip():
            raise ValueError("--query is empty")
        query, correct, vector = args.query, None, None
    source = extras["config"]["retrieval"].get("source")
    if not args.clips and not source:
        raise ValueError("--clips is needed for a corpus of expert files (the folder of the clips, one file per video id)")
    clips = video_paths_of_folder(args.clips or Path(source) / "clips")
    if vector is None:
        vector = spec.sentence_vectors(module, extras, [query])
    everything = rank_videos(module.model, part, vector, len(part.video_ids), correct_id=correct)
    ranking = everything[: args.top]
    out = draw_ranking(ranking, clips, query, args.out)
    print(f"query: {query}")
    for ranked in ranking:
        print(f"{ranked.rank}. {ranked.video_id}  {ranked.score:.3f}{'  correct' if ranked.correct else ''}")
    if correct is not None:
        found = next(r for r in everything if r.correct)
        print(f"the caption's video, {correct}, is at rank {found.rank} of {len(everything)} (score {found.score:.3f})")
    print(f"wrote {out}")
    return 0
