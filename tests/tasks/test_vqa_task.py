"""The engine's VQA accuracy (candidate table + VQAScore) against the official
string-level metric, and the image-disjoint validation split."""

from __future__ import annotations

import random

import pytest
import torch

from polyfuse.data.formats.vqa import VQAQuestion
from polyfuse.data.vqa_data import answer_table, split_by_image
from polyfuse.metrics.vqa import VQAAccuracy
from polyfuse.tasks.vqa import VQAScore

VOCABULARY = ["yes", "no", "2", "3", "red", "blue"]
POOL = ["yes", "no", "two", "2", "3", "three", "red", "Red.", "blue", "green", "a dog"]


def _questions(count: int, seed: int) -> list[VQAQuestion]:
    rng = random.Random(seed)
    questions = []
    for i in range(count):
        answers = tuple(rng.choice(POOL) for _ in range(10))
        kind = rng.choice(["yes/no", "number", "other"])
        questions.append(VQAQuestion(i, i // 3, f"question {i}", answers, kind, kind))
    return questions


def test_vqa_score_equals_the_official_accuracy():
    questions = _questions(60, seed=0)
    ids, scores = answer_table(questions, VOCABULARY)
    types = ["number", "other", "yes/no"]
    type_index = torch.tensor([types.index(q.answer_type) for q in questions])
    predicted = torch.randint(0, len(VOCABULARY), (len(questions),), generator=torch.Generator().manual_seed(1))
    metric = VQAScore(types)
    for batch in (slice(0, 25), slice(25, 60)):  # accumulated over batches
        metric.update(predicted[batch], ids[batch], scores[batch], type_index[batch])
    values = metric.compute()
    oracle = VQAAccuracy()  # the official evaluation on the answer strings
    oracle.update([VOCABULARY[p] for p in predicted.tolist()], [q.answers for q in questions],
                  [q.answer_type for q in questions])  # fmt: skip
    expected = oracle.compute()
    assert float(values["acc"]) == pytest.approx(expected["overall"] / 100, abs=1e-6)
    for name in types:
        assert float(values[f"acc/{name}"]) == pytest.approx(expected["per_answer_type"][name] / 100, abs=1e-6)


def test_answer_table_by_hand():
    # The humans differ, so the official VQA 2.0 script normalises them and the prediction
    # fully: "two" becomes "2", and "2" matches 4 humans; every leave-one-out subset keeps
    # at least 3 -> 1.0. "3" (one human): 9 subsets -> 1/3, one -> 0: mean 0.3.
    question = VQAQuestion(0, 0, "how many?", ("two", "2", "2", "two", "3", "4", "4", "4", "5", "6"), "number", "how many")
    ids, scores = answer_table([question], VOCABULARY)
    found = {VOCABULARY[i]: s for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True) if i >= 0}
    assert found == pytest.approx({"2": 1.0, "3": 0.3})


def test_validation_holds_whole_images():
    questions = _questions(90, seed=2)  # 30 images, 3 questions each
    train, valid = split_by_image(questions, 0.2, seed=5)
    assert len({q.image_id for q in valid}) == 6
    assert not {q.image_id for q in train} & {q.image_id for q in valid}
    assert len(train) + len(valid) == 90
    assert split_by_image(questions, 0.2, seed=5) == (train, valid)  # the seed fixes the draw
    with pytest.raises(ValueError, match="needs at least 2"):
        split_by_image(questions[:3], 0.2, seed=0)
