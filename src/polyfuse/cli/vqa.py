"""``polyfuse vqa``: import easy-VQA, compare fusions on VQA data over several seeds.

    polyfuse vqa import-easy-vqa runs/easyvqa/data
    polyfuse extract images <easy_vqa>/data/train/images --out runs/easyvqa/train.h5 --image-size 128
    polyfuse extract images <easy_vqa>/data/test/images --out runs/easyvqa/test.h5 --image-size 128
    polyfuse vqa compare --data runs/easyvqa/data --train-features runs/easyvqa/train.h5 \\
        --test-features runs/easyvqa/test.h5 --models ban,ban-nocount,concat,lmf,man --seeds 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "vqa",
        help="visual question answering: import easy-VQA, compare fusions",
        description="VQA with BAN (and its counter) against other fusions, VQA 2.0 format data.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    importer = actions.add_parser("import-easy-vqa", help="write easy-VQA in the VQA 2.0 JSON format")
    importer.add_argument("out", help="folder for {train,test}_{questions,annotations}.json")
    importer.add_argument("--limit", type=int, default=None, help="keep the first LIMIT image ids of each split")

    compare = actions.add_parser("compare", help="train and test several models over several seeds")
    _data_arguments(compare)
    compare.add_argument("--models", default="ban,ban-nocount,concat,lmf,man", help="comma-separated: ban, ban-nocount or fusion names")
    compare.add_argument("--seeds", type=int, default=3, help="number of seeds (default 3)")
    compare.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+SEEDS-1 (default 0)")
    compare.add_argument("--hidden-dim", type=int, default=1024, help="GRU and joint size (the paper: 1024)")
    compare.add_argument("--glimpses", type=int, default=8, help="BAN glimpses (the paper: 8)")
    compare.add_argument("--dropout", type=float, default=0.2, help="BAN dropout before linear maps (0.2; attention 0.5) or this value for both")
    compare.add_argument("--epochs", type=int, default=13, help="epochs (ban-vqa: 13)")
    compare.add_argument("--batch-size", type=int, default=256)
    compare.add_argument("--lr", type=float, default=2e-3, help="Adamax learning rate (ban-vqa: 2e-3)")
    compare.add_argument("--min-answer-count", type=int, default=9, help="answers given at least N times form the vocabulary")
    compare.add_argument("--feature-dim", type=int, default=None, help="reduce image features to this many principal components fitted on the training images (default: keep all)")
    compare.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    compare.add_argument("--out", required=True, help="folder for runs.json and summary.md")

    train = actions.add_parser("train", help="train one model, test it, save a checkpoint")
    _data_arguments(train)
    for name in ("--hidden-dim", "--glimpses", "--epochs", "--batch-size", "--lr", "--dropout", "--feature-dim", "--min-answer-count", "--threads"):
        action = next(a for a in compare._actions if name in a.option_strings)
        train.add_argument(name, type=action.type, default=action.default, help=action.help)
    train.add_argument("--model", default="ban", help="ban, ban-nocount or a fusion name")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", required=True, help="checkpoint file (.pt)")

    attention = actions.add_parser("attention", help="PNG of BAN's attention maps for test questions")
    attention.add_argument("--checkpoint", required=True, help="from `polyfuse vqa train --model ban`")
    attention.add_argument("--data", required=True, help="folder with test_{questions,annotations}.json")
    attention.add_argument("--test-features", required=True)
    attention.add_argument("--images", help="folder of the test images (<id>.png) to draw under the maps")
    attention.add_argument("--question-ids", required=True, help="comma-separated question ids")
    attention.add_argument("--out", required=True, help="folder for attention_<question id>.png")
    parser.set_defaults(run=run)


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="folder with {train,test}_{questions,annotations}.json")
    parser.add_argument("--train-features", required=True, help="HDF5 from `polyfuse extract images`")
    parser.add_argument("--test-features", required=True, help="HDF5 from `polyfuse extract images`")
    parser.add_argument("--glove", help="GloVe-format text file (300-d) to initialise the word embedding")


def _fusion_options(name: str, hidden_dim: int) -> dict:
    """Small, comparable settings of the other fusions (MAN with m = 2 modalities)."""
    if name == "lmf":
        return {"hidden_dims": hidden_dim, "rank": 4}
    if name == "concat":
        return {"hidden_dim": hidden_dim}
    if name == "man":
        return {"hidden_dim": hidden_dim}
    return {}


def run(args: argparse.Namespace) -> int:
    if args.action == "import-easy-vqa":
        from polyfuse.data.formats.easy_vqa import import_easy_vqa

        result = import_easy_vqa(args.out, limit=args.limit)
        for split, paths in result.items():
            print(f"{split}: {paths['questions']}, {paths['annotations']}; images in {paths['images']}")
        return 0
    if args.action == "attention":
        return _attention(args)
    if args.action == "train":
        return _train(args)
    return _compare(args)


def _load(args: argparse.Namespace):
    """Questions and features of both splits, features reduced by PCA when asked."""
    import torch

    from polyfuse.data.formats.features import load_image_features
    from polyfuse.data.formats.vqa import load_vqa
    from polyfuse.tasks.vqa import fit_pca, prepare_vqa, project_features

    if args.threads:
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    train_q = load_vqa(data / "train_questions.json", data / "train_annotations.json")
    test_q = load_vqa(data / "test_questions.json", data / "test_annotations.json")
    train_features = load_image_features(args.train_features)
    test_features = load_image_features(args.test_features)
    pca = None
    if args.feature_dim:
        pca = fit_pca(train_features.features, args.feature_dim)
        for features in (train_features, test_features):
            features.features = project_features(features.features, *pca)
    train, test, vocab = prepare_vqa(
        train_q, test_q, train_features, test_features, min_answer_count=args.min_answer_count
    )
    print(f"{len(train)} training and {len(test)} test questions, {len(vocab.words)} words, {len(vocab.answers)} answers")
    if args.glove:
        from polyfuse.data.formats.glove import load_glove

        vocab.word_vectors, found = load_glove(args.glove, vocab.words)
        print(f"{found} of {len(vocab.words)} words found in {args.glove}")
    return train, test, vocab, pca


def _settings(args: argparse.Namespace, name: str, image_dim: int, pca) -> dict:
    settings = {
        "model": name,
        "image_dim": image_dim,
        "hidden_dim": args.hidden_dim,
        "glimpses": args.glimpses,
        "dropout": args.dropout,
        "fusion_options": _fusion_options(name, args.hidden_dim),
    }
    if pca is not None:
        settings["pca_mean"], settings["pca_directions"] = pca
    return settings


def _train(args: argparse.Namespace) -> int:
    from polyfuse.tasks.vqa import build_vqa_model, evaluate_vqa, save_vqa_checkpoint, train_vqa

    train, test, vocab, pca = _load(args)
    settings = _settings(args, args.model, train.features.shape[-1], pca)
    model = build_vqa_model(
        args.model,
        vocab,
        settings["image_dim"],
        hidden_dim=args.hidden_dim,
        glimpses=args.glimpses,
        seed=args.seed,
        fusion_options=settings["fusion_options"],
        dropout=args.dropout,
        word_vectors=vocab.word_vectors,
    )
    log = train_vqa(model, train, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    result = evaluate_vqa(model, test, vocab.answers)
    save_vqa_checkpoint(args.out, model, vocab, settings)
    print(json.dumps({"test": result, "train_seconds": round(log.seconds, 1), "losses": log.losses}, indent=1))
    print(f"checkpoint: {args.out}")
    return 0


def _attention(args: argparse.Namespace) -> int:
    import math

    import numpy as np
    import torch

    from polyfuse.data.formats.features import load_image_features
    from polyfuse.data.formats.vqa import encode_questions, load_vqa, tokenize
    from polyfuse.engine.vqa_report import plot_vqa_attention
    from polyfuse.tasks.vqa import load_vqa_checkpoint, project_features

    model, vocab, settings = load_vqa_checkpoint(args.checkpoint)
    if settings["model"] not in ("ban", "ban-nocount"):
        raise ValueError(f"{args.checkpoint}: a {settings['model']} model has no bilinear attention maps")
    data = Path(args.data)
    questions = {q.question_id: q for q in load_vqa(data / "test_questions.json", data / "test_annotations.json")}
    wanted = [int(v) for v in args.question_ids.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in questions]
    if unknown:
        raise ValueError(f"question ids {unknown} are not in {data / 'test_questions.json'}")
    features = load_image_features(args.test_features)
    if "pca_mean" in settings:
        features.features = project_features(features.features, settings["pca_mean"], settings["pca_directions"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for question_id in wanted:
        question = questions[question_id]
        image, boxes = features.select([question.image_id])
        tokens = encode_questions([question], vocab.words)
        with torch.no_grad():
            logits, attention = model(tokens, image, boxes)
        words = tokenize(question.question)[: tokens.shape[1]]
        words += ["-"] * (tokens.shape[1] - len(words))
        side = math.isqrt(image.shape[1])
        grid = (side, side) if side * side == image.shape[1] else (1, image.shape[1])  # regions: one row
        picture = None
        if args.images:
            from PIL import Image

            picture = np.asarray(Image.open(Path(args.images) / f"{question.image_id}.png").convert("RGB"))
        answer = vocab.answers[int(logits.argmax())]
        title = f"{question.question}  predicted: {answer}  (truth: {question.answers[0]})"
        path = plot_vqa_attention(attention[0], words, grid, picture, out / f"attention_{question_id}.png", title=title)
        print(f"wrote {path}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    import time

    from polyfuse.engine.vqa_report import write_vqa_summary
    from polyfuse.tasks.vqa import build_vqa_model, evaluate_vqa, train_vqa

    train, test, vocab, _ = _load(args)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    start = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            model = build_vqa_model(
                name,
                vocab,
                train.features.shape[-1],
                hidden_dim=args.hidden_dim,
                glimpses=args.glimpses,
                seed=seed,
                fusion_options=_fusion_options(name, args.hidden_dim),
                dropout=args.dropout,
                word_vectors=vocab.word_vectors,
            )
            log = train_vqa(model, train, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed)
            result = evaluate_vqa(model, test, vocab.answers)
            parameters = sum(p.numel() for p in model.parameters())
            runs.append({"model": name, "seed": seed, "seconds": log.seconds, "losses": log.losses, "parameters": parameters, **result})
            print(f"{name} seed {seed}: {result['overall']:.2f} % in {log.seconds:.0f} s")
            (out / "runs.json").write_text(json.dumps(runs, indent=1))
    total = time.perf_counter() - start
    summary = write_vqa_summary(runs, out, wall_seconds=total)
    print()
    print(summary)
    return 0
