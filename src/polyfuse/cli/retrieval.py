"""``polyfuse retrieval train|evaluate|compare``: text-video retrieval over expert features."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# polyfuse.nn.models.retrieval.VIDEO_FUSIONS and polyfuse.engine.retrieval.LOOP_PRECISIONS,
# written out: the parser must not import torch
FUSIONS = ("man", "concat", "mean", "gating", "gating+man", "mean+man")
PRECISIONS = ("32-true", "bf16-mixed")
_PRECISION_HELP = "32-true (default) or bf16-mixed: training steps under CPU bfloat16 autocast"

__all__ = ["add_parser", "run"]


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
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=_size, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--embed-dim", type=_size, default=256)
    parser.add_argument("--hidden-dim", type=_size, default=64)
    parser.add_argument("--loss", choices=("margin", "infonce"), default="margin")
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--text-lr", type=float, default=None,
                        help="fine-tune the text encoder (MiniLM or word vectors) at this learning rate "
                        "(default: frozen)")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true", help=_PRECISION_HELP)
    man = parser.add_argument_group("MAN (fusions man, gating+man, mean+man)")
    man.add_argument("--man-heads", type=_size, default=None, help="heads (default 4; the paper's retrieval: 8)")
    man.add_argument("--man-random-features", type=_size, default=None,
                     help="random features per head of had mode (default 64; the paper: 512)")
    man.add_argument("--man-chunks", type=int, default=None, help="LSC chunks (default 4; the paper: 10)")
    man.add_argument("--man-layer-norm", action=argparse.BooleanOptionalAction, default=None,
                     help="layer-normalise MAN's fused vector before its output map (default: on for "
                     "gating+man and mean+man, off for man; docs/RETRIEVAL.md)")
    man.add_argument("--man-zero-init", action=argparse.BooleanOptionalAction, default=None,
                     help="mean+man: MAN's branch starts at zero (zero-initialised output map, its share "
                     "of the score learned; default on); --no-man-zero-init: both branches unit vectors "
                     "weighed equally (docs/RETRIEVAL.md)")
    man.add_argument("--man-lr", type=float, default=None,
                     help="gating+man, mean+man: learning rate of MAN's video branch (default: --lr)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("retrieval", help="text-video retrieval: train, evaluate, compare")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train one video fusion over seeds; write results.json")
    _data_arguments(train)
    _train_arguments(train)
    train.add_argument("--fusion", choices=FUSIONS, default="man")
    train.add_argument("--out", required=True, help="run directory")
    compare = actions.add_parser("compare", help="train several fusions; print a markdown table")
    _data_arguments(compare)
    _train_arguments(compare)
    compare.add_argument("--fusions", nargs="+", default=["man", "concat", "mean"])
    compare.add_argument("--out", required=True, help="parent directory; one run directory per fusion")
    chimera = actions.add_parser("chimera", help="Chimera ablation rows (Table 4) on MiniLM + video; EX1 and EX2")
    _data_arguments(chimera)
    chimera.add_argument("--rows", nargs="+", default=None,
                         help="ablation rows (default: the ten of Table 4; Z20-af-N20-HLM-LD-noLT is the first without L_T)")
    chimera.add_argument("--seeds", type=int, nargs="+", default=[0])
    chimera.add_argument("--epochs", type=int, default=10, help="most epochs per model (default 10)")
    chimera.add_argument("--patience", type=int, default=None,
                         help="stop after this many epochs without a better validation recall sum (default: none)")
    chimera.add_argument("--batch-size", type=_size, default=16)
    chimera.add_argument("--lr", type=float, default=1e-3)
    chimera.add_argument("--scalar-lr", type=float, default=None,
                         help="learning rate of the scalars omega_t, omega_v, beta, c (default: --lr)")
    chimera.add_argument("--tlm-temperature", type=float, default=1.0,
                         help="divisor of L_TLM's inner products (default 1, the paper's)")
    chimera.add_argument("--mask-rate", type=float, default=0.2,
                         help="share of word pieces ([MASK], the targets of L_T) and of video steps (dropped) "
                         "masked in each training step, Table 4's protocol (default 0.2; 0: no masking, no L_T)")
    chimera.add_argument("--chimera-expert", default=None,
                         help="the video expert Chimera reads (default: the first, MSVD's vgg_appearance)")
    chimera.add_argument("--text-lr", type=float, default=None,
                         help="fine-tune MiniLM with each model at this learning rate (default: frozen)")
    chimera.add_argument("--precision", choices=PRECISIONS, default="32-true", help=_PRECISION_HELP)
    chimera.add_argument("--out", required=True)
    table = actions.add_parser("table", help="markdown tables (EX1, EX2) from results.json files")
    table.add_argument("results", nargs="+", help="results.json of 'train' (one fusion each) or 'chimera'")
    evaluate = actions.add_parser("evaluate", help="test metrics of a saved seed<N>.safetensors")
    _data_arguments(evaluate)
    evaluate.add_argument("--checkpoint", required=True)
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--shuffle-words", action="store_true", help="shuffle each query's words (EX2)")
    figure = actions.add_parser("figure", help="top videos of one query as frame thumbnails with scores (PNG)")
    _data_arguments(figure)
    figure.add_argument("--checkpoint", required=True, help="a seed<N>.safetensors of 'train'")
    query = figure.add_mutually_exclusive_group(required=True)
    query.add_argument("--query", help="free text")
    query.add_argument("--caption", type=int, help="index of a caption of the split (its video is marked correct)")
    figure.add_argument("--clips", help="folder of the clips, one file per video id (default: <data>/clips)")
    figure.add_argument("--split", default="test")
    figure.add_argument("--top", type=int, default=5)
    figure.add_argument("--out", required=True, help="PNG path")
    parser.set_defaults(run=run)


def _corpus(args: argparse.Namespace):
    from polyfuse.engine.retrieval_runs import load_corpus

    ids = {n: getattr(args, f"{n}_ids") for n in ("train", "val", "test") if getattr(args, f"{n}_ids")}
    return load_corpus(args.data, experts=args.expert, captions=args.captions, split_ids=ids or None)


def _settings(args: argparse.Namespace, fusion: str):
    from polyfuse.engine.retrieval import RetrievalSettings

    man_options = {"heads": args.man_heads, "num_random_features": args.man_random_features,
                   "chunks": args.man_chunks}
    return RetrievalSettings(fusion=fusion, embed_dim=args.embed_dim, hidden_dim=args.hidden_dim,
                             epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, loss=args.loss,
                             margin=args.margin, text_lr=args.text_lr, precision=args.precision,
                             man_layer_norm=args.man_layer_norm,
                             man_zero_init=args.man_zero_init if fusion == "mean+man" else None,
                             man_lr=args.man_lr if fusion in ("gating+man", "mean+man") else None,
                             fusion_options={k: v for k, v in man_options.items()
                                             if v is not None and "man" in fusion.split("+")})


def _references(args: argparse.Namespace, corpus, split) -> dict | None:
    """The synthetic corpus's recall bounds on its test split (None for real data)."""
    from polyfuse.data.sources import is_synthetic

    if args.data is None or not is_synthetic(args.data):
        return None
    from polyfuse.data.synthetic_retrieval import recall_bounds

    return recall_bounds(corpus.subset(split["test"]))


def run(args: argparse.Namespace) -> int:
    from polyfuse.engine.retrieval_runs import metrics_table, run_retrieval

    if args.action == "table":
        from polyfuse.data.formats.jsonfile import read_json

        results = {}
        for path in args.results:
            data = read_json(path)
            if isinstance(data, dict) and "settings" not in data:  # Chimera's: rows and the LM head's report
                data = {k: v for k, v in data.items() if k != "lm_head"}
            if not isinstance(data, dict) or not all(isinstance(v, dict) and "runs" in v for v in
                                                     ([data] if "settings" in data else data.values())):
                raise ValueError(f"{path}: not a results.json of `polyfuse retrieval train` or `chimera`")
            results.update({data["settings"].get("fusion", "?"): data} if "settings" in data else data)
        print("EX1 (captions as written)\n" + metrics_table(results))
        print("\nEX2 (words of each caption shuffled)\n" + metrics_table(results, "test_shuffled_words"))
        return 0
    corpus, split = _corpus(args)
    references = _references(args, corpus, split)
    if args.action == "train":
        result = run_retrieval(corpus, split, _settings(args, args.fusion), args.seeds, args.out, text=args.text,
                               references=references)
        print(metrics_table({args.fusion: result}))
        print(f"wrote {Path(args.out) / 'results.json'}")
        return 0
    if args.action == "chimera":
        from polyfuse.engine.chimera_retrieval import TABLE4_ROWS
        from polyfuse.engine.retrieval_runs import run_chimera_ablation

        results = run_chimera_ablation(corpus, split, args.rows or TABLE4_ROWS, args.seeds, args.out,
                                       epochs=args.epochs, batch_size=args.batch_size, text_lr=args.text_lr,
                                       expert=args.chimera_expert, precision=args.precision,
                                       mask_rate=args.mask_rate, patience=args.patience, lr=args.lr,
                                       scalar_lr=args.scalar_lr, tlm_temperature=args.tlm_temperature)
        print("EX1 (captions as written)\n" + metrics_table(results))
        print("\nEX2 (words of each caption shuffled)\n" + metrics_table(results, "test_shuffled_words"))
        return 0
    if args.action == "compare":
        results = {}
        for fusion in args.fusions:
            results[fusion] = run_retrieval(corpus, split, _settings(args, fusion), args.seeds,
                                            Path(args.out) / fusion, text=args.text, references=references)
        print("EX1 (captions as written)\n" + metrics_table(results))
        print("\nEX2 (words of each caption shuffled)\n" + metrics_table(results, "test_shuffled_words"))
        return 0
    from polyfuse.engine.retrieval import encode_captions, evaluate_retrieval, shuffle_words
    from polyfuse.engine.retrieval_runs import (
        load_checkpoint,
        read_retrieval_checkpoint,
        saved_text_encoder,
    )

    if args.split not in split:
        raise ValueError(f"no split {args.split!r}; have {', '.join(split)}")
    part = corpus.subset(split[args.split])
    saved = read_retrieval_checkpoint(args.checkpoint)  # never unpickles anything
    if saved.get("kind") == "chimera":  # a model of `retrieval chimera`
        if args.action == "figure":
            raise ValueError("`figure` draws the rankings of `retrieval train` models, not of Chimera's")
        from polyfuse.engine.retrieval_runs import evaluate_chimera_checkpoint

        captions = shuffle_words(part.captions, 0) if args.shuffle_words else part.captions
        print(json.dumps(evaluate_chimera_checkpoint(saved, part, captions), indent=1))
        return 0
    model, saved = load_checkpoint(args.checkpoint)
    if args.action == "figure":
        return _figure(args, model, saved, part)
    captions = shuffle_words(part.captions, 0) if args.shuffle_words else part.captions
    vectors = encode_captions(saved_text_encoder(saved, corpus), captions)
    print(json.dumps(evaluate_retrieval(model, part, vectors), indent=1))
    return 0


def _figure(args: argparse.Namespace, model, saved: dict, part) -> int:
    from polyfuse.engine.retrieval import encode_captions
    from polyfuse.engine.retrieval_figure import draw_ranking, rank_videos
    from polyfuse.engine.retrieval_runs import saved_text_encoder
    from polyfuse.extract.video import video_paths_of_folder

    if args.caption is not None:
        if not 0 <= args.caption < len(part.captions):
            raise ValueError(f"--caption {args.caption}: the {args.split} split has captions 0 to {len(part.captions) - 1}")
        query, correct = part.captions[args.caption], part.caption_video[args.caption]
    else:
        if not args.query.strip():
            raise ValueError("--query is empty")
        query, correct = args.query, None
    if not args.clips and not args.data:
        raise ValueError("--clips is needed with --expert (the folder of the clips, one file per video id)")
    clips = video_paths_of_folder(args.clips or Path(args.data) / "clips")
    vector = encode_captions(saved_text_encoder(saved), [query])
    everything = rank_videos(model, part, vector, len(part.video_ids), correct_id=correct)
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
