"""The VQA candidate table by hand, and the image-disjoint validation split (VQAScore
against the official string-level accuracy: tests/metrics/test_vqa_metric.py)."""

from __future__ import annotations

import random

import pytest
import torch

from polyfuse.data.formats.vqa import VQAQuestion
from polyfuse.tasks.vqa.data import answer_table, split_by_image

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


def _ban_vqa_train_loop_lrs(lr_default: float, epochs: int) -> list[float]:
    """The learning rate of each epoch as ban-vqa's train.py sets it (its loop, restated)."""
    gradual_warmup_steps = [0.5 * lr_default, 1.0 * lr_default, 1.5 * lr_default, 2.0 * lr_default]
    lr_decay_epochs = range(10, 20, 2)
    lr, lrs = lr_default, []
    for epoch in range(epochs):
        if epoch < len(gradual_warmup_steps):
            lr = gradual_warmup_steps[epoch]
        elif epoch in lr_decay_epochs:
            lr *= 0.25
        lrs.append(lr)
    return lrs


def test_adamax_with_ban_vqa_warmup_and_decay():
    from polyfuse.nn.models.vqa import FusionVQA
    from polyfuse.tasks.vqa.spec import VQATask

    model = FusionVQA("concat", 4, 3, 5, hidden_dim=4, embedding_dim=4)
    task = VQATask(model, type_names=["other"], lr=1e-3, optimizer="adamax", scheduler="ban_warmup")
    configured = task.configure_optimizers()
    optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.Adamax) and schedule["interval"] == "epoch"
    lrs = []
    for _ in range(22):
        lrs.append(optimizer.param_groups[0]["lr"])
        assert optimizer.param_groups[1]["lr"] == lrs[-1]  # biases (no decay) follow the same schedule
        optimizer.step()
        schedule["scheduler"].step()
    # by hand: 0.5, 1, 1.5, 2 x 1e-3 in epochs 0-3; 2e-3 to epoch 9; x 0.25 at 10, 12, 14, 16, 18
    # (range(10, 20, 2)), then no further decay
    by_hand = [5e-4, 1e-3, 1.5e-3] + [2e-3] * 7 + [5e-4] * 2 + [1.25e-4] * 2 + [3.125e-5] * 2
    by_hand += [7.8125e-6] * 2 + [1.953125e-6] * 4
    assert lrs == pytest.approx(by_hand, rel=1e-12)
    assert lrs == pytest.approx(_ban_vqa_train_loop_lrs(1e-3, 22), rel=1e-12)
    # the paper's (BAN section 5.4): min(i x 1e-3, 4e-3) for epoch i = 1, 2, ..., 1e-3 in the
    # 11th and 2.5e-4 in the 13th epoch: the same schedule from base 2e-3
    paper = VQATask(model, type_names=["other"], lr=2e-3, optimizer="adamax", scheduler="ban_warmup")
    configured = paper.configure_optimizers()
    paper_lrs = []
    for _ in range(13):
        paper_lrs.append(configured["optimizer"].param_groups[0]["lr"])
        configured["optimizer"].step()
        configured["lr_scheduler"]["scheduler"].step()
    assert paper_lrs[:4] == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3]) and paper_lrs[10] == pytest.approx(1e-3)
    assert paper_lrs[12] == pytest.approx(2.5e-4)
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; expected one of adamw, adamax"):
        VQATask(model, type_names=["other"], optimizer="sgd")
