"""``polyfuse vqa import-easy-vqa``: write easy-VQA in the VQA 2.0 JSON format.

Training, evaluation, comparison and attention figures of VQA models go through the
engine's commands with a ``task.type: vqa`` configuration (docs/VQA.md)::

    polyfuse extract images <easy_vqa>/data/train/images --out runs/easyvqa/train_128.h5 --image-size 128
    polyfuse extract images <easy_vqa>/data/test/images --out runs/easyvqa/test_128.h5 --image-size 128
    polyfuse train --config configs/easy_vqa/ban.yaml
    polyfuse compare --config configs/easy_vqa/ban.yaml --models ban,configs/easy_vqa/ban_nocount.yaml,concat,lmf,man --seeds 3
    polyfuse plot attention --checkpoint RUN/checkpoints/best.safetensors --question-ids 0,5 --out attention.png
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "vqa",
        help="visual question answering data: import easy-VQA",
        description="Write easy-VQA in the VQA 2.0 JSON format. VQA models are trained, compared and "
        "inspected with polyfuse train / evaluate / predict / compare / plot and a task.type: vqa "
        "configuration (configs/easy_vqa/, docs/VQA.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    importer = actions.add_parser("import-easy-vqa", help="write easy-VQA in the VQA 2.0 JSON format")
    importer.add_argument("out", help="folder for {train,test}_{questions,annotations}.json")
    importer.add_argument("--limit", type=int, default=None, help="keep the first LIMIT image ids of each split")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from polyfuse.data.formats.easy_vqa import import_easy_vqa

    result = import_easy_vqa(args.out, limit=args.limit)
    for split, paths in result.items():
        print(f"{split}: {paths['questions']}, {paths['annotations']}; images in {paths['images']}")
    return 0
