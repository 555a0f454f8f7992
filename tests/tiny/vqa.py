"""A synthetic VQA set that can be learnt exactly (the colour asked about is written in
the image features), its ``task.type vqa`` configuration, and in-memory questions with
ten human answers each."""

from __future__ import annotations

import json
import random
from pathlib import Path

import h5py
import numpy as np
import yaml
from tests.tiny import TRAINER

from polyfuse.data.formats.vqa import VQAQuestion

#: the two questions asked about every image: (text, question type)
QUESTIONS = [("what color is the shape?", "color"), ("is the shape red?", "yes/no")]


def _write_split(folder: Path, split: str, images: int, generator: np.random.Generator) -> None:
    questions, annotations = [], []
    features = np.zeros((images, 16, 6), dtype=np.float16)
    for image_id in range(images):
        red = image_id % 2 == 1
        features[image_id, :, 0] = 1.0 if red else -1.0
        features[image_id, :, 1:] = generator.normal(size=(16, 5)) * 0.1
        for k, (text, kind) in enumerate(QUESTIONS):
            question_id = 10 * image_id + k
            answer = ("red" if red else "blue") if kind == "color" else ("yes" if red else "no")
            # one human of ten disagrees: the accuracy of the right answer is still 1
            answers = [answer] * 9 + ["green"]
            questions.append({"question_id": question_id, "image_id": image_id, "question": text})
            annotations.append(
                {"question_id": question_id, "image_id": image_id, "answers": [{"answer": a} for a in answers],
                 "answer_type": "yes/no" if kind == "yes/no" else "other", "question_type": kind}
            )  # fmt: skip
    (folder / f"{split}_questions.json").write_text(json.dumps({"questions": questions}))
    (folder / f"{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))
    with h5py.File(folder / f"{split}.h5", "w") as handle:
        handle["features"] = features
        corners = generator.uniform(size=(images, 16, 2)).astype(np.float32)
        handle["boxes"] = np.concatenate([corners, corners + 0.1], axis=-1)
        handle["image_ids"] = np.arange(images)


def vqa_config(folder: Path, ban: dict | None = None, **model) -> dict:
    """The ``task.type vqa`` configuration of the files :func:`write_vqa_folder` writes in
    ``folder`` (a small BAN; ``ban`` overrides keys of ``model.options.ban``, ``model`` those of ``model.vqa``)."""
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "vqa"},
        "data": {
            "batch_size": 12, "validation_fraction": 0.25,
            "vqa": {
                **{f"{s}_{kind}": str(folder / f"{s}_{kind}.json") for s in ("train", "test") for kind in ("questions", "annotations")},
                "train_features": str(folder / "train.h5"), "test_features": str(folder / "test.h5"),
                "min_answer_count": 1, "breakdown": "question_type",
            },
        },
        "model": {
            "fusion": "ban",
            "vqa": {"hidden_dim": 8, "embedding_dim": 8, "counter_objects": 4, "classifier_dropout": 0.0, **model},
            "options": {"ban": {"glimpses": 1, "dropout": 0.0, "attention_dropout": 0.0, **(ban or {})},
                        "concat": {"hidden_dim": 32}},
        },
        "optim": {"lr": 0.02},
        "trainer": {"max_epochs": 20, "patience": 0, "num_threads": 1, "progress_bar": False, "quiet": True},
    }  # fmt: skip


def write_vqa_folder(folder: Path, train_images: int = 24, test_images: int = 8) -> Path:
    """The two splits' JSON and HDF5 files and ``vqa.yaml`` in ``folder``."""
    generator = np.random.default_rng(0)
    _write_split(folder, "train", train_images, generator)
    _write_split(folder, "test", test_images, generator)
    (folder / "vqa.yaml").write_text(yaml.safe_dump(vqa_config(folder)))
    return folder


#: the candidate answers of :func:`random_questions`' table
VOCABULARY = ["yes", "no", "2", "3", "red", "blue"]
_POOL = ["yes", "no", "two", "2", "3", "three", "red", "Red.", "blue", "green", "a dog"]


def random_questions(count: int, seed: int) -> list[VQAQuestion]:
    """``count`` questions, three per image, each with ten answers drawn from a pool of
    raw strings (number words, capitals, a final period) and a random question type."""
    rng = random.Random(seed)
    questions = []
    for i in range(count):
        answers = tuple(rng.choice(_POOL) for _ in range(10))
        kind = rng.choice(["yes/no", "number", "other"])
        questions.append(VQAQuestion(i, i // 3, f"question {i}", answers, kind, kind))
    return questions


def vqa_task_config(folder: Path) -> dict:
    """:func:`write_vqa_folder`'s files in ``folder`` and their configuration with dropout
    0.2 and the tiny trainer section (:data:`tests.tiny.TRAINER`)."""
    write_vqa_folder(folder)
    config = vqa_config(folder, ban={"dropout": 0.2})
    config["trainer"] = {**config["trainer"], **TRAINER}
    return config
