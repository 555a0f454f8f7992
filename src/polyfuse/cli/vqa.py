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
    compare.add_argument("--data", required=True, help="folder with {train,test}_{questions,annotations}.json")
    compare.add_argument("--train-features", required=True, help="HDF5 from `polyfuse extract images`")
    compare.add_argument("--test-features", required=True, help="HDF5 from `polyfuse extract images`")
    compare.add_argument("--models", default="ban,ban-nocount,concat,lmf,man", help="comma-separated: ban, ban-nocount or fusion names")
    compare.add_argument("--seeds", type=int, default=3, help="seeds 0..SEEDS-1 (default 3)")
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
    parser.set_defaults(run=run)


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
    return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    import time

    import torch

    from polyfuse.data.formats.features import load_image_features
    from polyfuse.data.formats.vqa import load_vqa
    from polyfuse.engine.vqa_report import write_vqa_summary
    from polyfuse.tasks.vqa import (
        build_vqa_model,
        evaluate_vqa,
        fit_pca,
        prepare_vqa,
        project_features,
        train_vqa,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    train_q = load_vqa(data / "train_questions.json", data / "train_annotations.json")
    test_q = load_vqa(data / "test_questions.json", data / "test_annotations.json")
    train_features = load_image_features(args.train_features)
    test_features = load_image_features(args.test_features)
    if args.feature_dim:
        mean, directions = fit_pca(train_features.features, args.feature_dim)
        for features in (train_features, test_features):
            features.features = project_features(features.features, mean, directions)
    train, test, vocab = prepare_vqa(
        train_q, test_q, train_features, test_features, min_answer_count=args.min_answer_count
    )
    print(f"{len(train)} training and {len(test)} test questions, {len(vocab.words)} words, {len(vocab.answers)} answers")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    start = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for seed in range(args.seeds):
            model = build_vqa_model(
                name,
                vocab,
                train.features.shape[-1],
                hidden_dim=args.hidden_dim,
                glimpses=args.glimpses,
                seed=seed,
                fusion_options=_fusion_options(name, args.hidden_dim),
                dropout=args.dropout,
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
