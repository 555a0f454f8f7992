"""Task type ``vqa`` (polyfuse.tasks.vqa): the candidate table by hand, the image-disjoint
validation split, the optimiser's schedule, the loss, the features' PCA, and the
``data.vqa`` options' effect on the vocabulary (answers_from by hand) and targets (VQAScore against the official
string-level accuracy: tests/metrics/test_vqa_metric.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from tests.tiny.vqa import VOCABULARY, random_questions, write_vqa_folder

from polyfuse.data.formats.features import ImageFeatures
from polyfuse.data.formats.vqa import UNKNOWN_WORD, VQAQuestion
from polyfuse.engine.config import resolve_config
from polyfuse.tasks.vqa.data import (
    answer_questions,
    answer_table,
    build_vqa_data,
    fit_pca,
    project_features,
    split_by_image,
)
from polyfuse.tasks.vqa.spec import vqa_loss


def test_answer_table_by_hand():
    # The humans differ, so the official VQA 2.0 script normalises them and the prediction
    # fully: "two" becomes "2", and "2" matches 4 humans; every leave-one-out subset keeps
    # at least 3 -> 1.0. "3" (one human): 9 subsets -> 1/3, one -> 0: mean 0.3.
    question = VQAQuestion(0, 0, "how many?", ("two", "2", "2", "two", "3", "4", "4", "4", "5", "6"), "number", "how many")
    ids, scores = answer_table([question], VOCABULARY)
    found = {VOCABULARY[i]: s for i, s in zip(ids[0].tolist(), scores[0].tolist(), strict=True) if i >= 0}
    assert found == pytest.approx({"2": 1.0, "3": 0.3})


def test_validation_holds_whole_images():
    questions = random_questions(90, seed=2)  # 30 images, 3 questions each
    train, val = split_by_image(questions, 0.2, seed=5)
    assert len({q.image_id for q in val}) == 6
    assert not {q.image_id for q in train} & {q.image_id for q in val}
    assert len(train) + len(val) == 90
    assert split_by_image(questions, 0.2, seed=5) == (train, val)  # the seed fixes the draw
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
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; expected one of adamw, adam, adamax"):
        VQATask(model, type_names=["other"], optimizer="sgd")


def test_vqa_loss_is_bce_summed_over_answers():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 1.0]])
    targets = torch.tensor([[1.0, 1 / 3], [0.0, 1.0]])
    expected = 0.0
    for row in range(2):
        for column in range(2):
            p = 1 / (1 + np.exp(-logits[row, column].item()))
            t = targets[row, column].item()
            expected -= t * np.log(p) + (1 - t) * np.log(1 - p)
    assert vqa_loss(logits, targets).item() == pytest.approx(expected / 2, rel=1e-6)
    assert F.binary_cross_entropy_with_logits(logits, targets).item() != pytest.approx(expected / 2)


def test_pca_matches_covariance_eigenvectors():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(50, 3, 6, generator=generator, dtype=torch.float64) * torch.tensor(
        [5.0, 3.0, 1.0, 0.5, 0.2, 0.1], dtype=torch.float64
    )
    features[0, 2] = 0.0  # a padding row: left out of the fit, stays zero
    images = ImageFeatures(features, torch.zeros(50, 3, 4), {i: i for i in range(50)}, "test")
    mean, directions = fit_pca(images, range(50), 2, chunk=7)
    rows = features.reshape(-1, 6).numpy()
    rows = rows[np.abs(rows).sum(axis=1) != 0]
    values, vectors = np.linalg.eigh(np.cov(rows, rowvar=False))
    top = vectors[:, ::-1][:, :2]
    np.testing.assert_allclose(np.abs(top.T @ directions.numpy()), np.eye(2), atol=1e-8)
    projected = project_features(features, mean, directions)
    assert projected[0, 2].abs().sum() == 0
    real = projected.reshape(-1, 2)[torch.from_numpy(np.abs(features.reshape(-1, 6).numpy()).sum(1) != 0)]
    np.testing.assert_allclose(real.var(dim=0).numpy(), values[::-1][:2], rtol=1e-8)


def test_pca_draws_the_rows_one_array_would(tmp_path):
    # more real rows than max_rows: the streamed fit keeps the rows a randperm over one
    # array of all real rows keeps, in the draw's order (the rule before streaming)
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(40, 5, 4, generator=generator)
    features[3, 1:] = 0.0  # padding rows
    features[17, 4] = 0.0
    images = ImageFeatures(features, torch.zeros(40, 5, 4), {i: i for i in range(40)}, "test")
    rows = [2, 3, 5, 17, 20, 33]
    real = features[rows].reshape(-1, 4)
    real = real[real.abs().sum(dim=1) != 0]
    drawn = real[torch.randperm(len(real), generator=torch.Generator().manual_seed(9))[:11]]
    mean, directions = fit_pca(images, rows, 2, max_rows=11, seed=9, chunk=4)
    assert torch.equal(mean, drawn.mean(dim=0))
    _, vectors = torch.linalg.eigh((drawn - drawn.mean(dim=0)).double().T @ (drawn - drawn.mean(dim=0)).double())
    assert torch.equal(directions, vectors[:, -2:].flip(1).float())
    with pytest.raises(ValueError, match=r"feature_dim must lie in \[1, 4\], got 5"):
        fit_pca(images, rows, 5)


def _all_targets(split):
    return split.targets(torch.arange(len(split)))


def test_data_vqa_options_reach_the_vocabulary_and_targets(tmp_path):
    # every question: its answer given by 9 humans, "green" by 1 (the multiple-choice
    # answer of no question)
    config = yaml.safe_load((write_vqa_folder(tmp_path, 8, 4) / "vqa.yaml").read_text())
    data = build_vqa_data(resolve_config(config), splits=("train",))
    assert "green" not in data.answers and data.words[-1] == UNKNOWN_WORD
    assert sorted(set(_all_targets(data.splits["train"]).flatten().tolist())) == [0.0, 1.0]
    config["data"]["vqa"].update(answer_count="all_answers", soft_score="min_third")
    data = build_vqa_data(resolve_config(config), splits=("train",))
    green = _all_targets(data.splits["train"])[:, data.answers.index("green")]
    assert torch.equal(green, torch.full_like(green, 1 / 3))
    config["data"]["vqa"]["soft_score"] = "ban_vqa"
    green = _all_targets(build_vqa_data(resolve_config(config), splits=("train",)).splits["train"])[:, -1]
    assert data.answers[-1] == "green" and torch.equal(green, torch.full_like(green, 0.3))


@pytest.mark.parametrize("fusion", ["ban", "concat"])
def test_vqa_models_built_from_a_config_take_the_second_embedding(fusion):
    """model.vqa.second_embedding_dim reaches the question encoder of BanVQA and of
    FusionVQA: a GRU of E + E2 inputs, both tables starting from the GloVe rows when E2 = E."""
    from polyfuse.engine.config import resolve_config
    from polyfuse.nn.models.vqa import BanVQA, FusionVQA
    from polyfuse.tasks.vqa.spec import build_vqa_model

    config = resolve_config({
        "task": {"type": "vqa"},
        "data": {"vqa": {"easy_vqa": True, "train_features": "t.h5", "test_features": "s.h5"}},
        "model": {"fusion": fusion, "vqa": {"hidden_dim": 8, "embedding_dim": 3, "second_embedding_dim": 3},
                  "options": {"ban": {"glimpses": 2}}},
    })  # fmt: skip
    vectors = torch.arange(12, dtype=torch.float32).view(4, 3)
    model = build_vqa_model(config, 4, 3, 5, word_vectors=vectors)
    assert isinstance(model, BanVQA if fusion == "ban" else FusionVQA)
    assert model.question.gru.input_size == 6
    torch.testing.assert_close(model.question.second_embedding.weight[:4], vectors)
    torch.testing.assert_close(model.question.embedding.weight[:4], vectors)
    config["model"]["vqa"]["second_embedding_dim"] = None
    assert build_vqa_model(config, 4, 3, 5).question.second_embedding is None


def test_bans_options_reach_the_vqa_model_and_its_size_is_the_question_encoders():
    """model.options.ban (glimpses, dropouts, attention rank) builds BanVQA's BAN; the
    attention rank K' is k times model.vqa.hidden_dim unless set; hidden_dim there is refused."""
    from polyfuse.engine.config import resolve_config
    from polyfuse.tasks.vqa.spec import build_vqa_model

    config = resolve_config({
        "task": {"type": "vqa"},
        "data": {"vqa": {"easy_vqa": True, "train_features": "t.h5", "test_features": "s.h5"}},
        "model": {"fusion": "ban", "vqa": {"hidden_dim": 8, "embedding_dim": 3},
                  "options": {"ban": {"glimpses": 3, "dropout": 0.1, "attention_dropout": 0.4, "k": 2}}},
    })  # fmt: skip
    model = build_vqa_model(config, 4, 3, 5)
    assert (model.glimpses, model.ban.attention_rank, model.ban.hidden_dim) == (3, 16, 8)
    assert len(model.count_projections) == 3 and model.attention_bias.shape == (3,)
    assert (model.ban.dropout, model.ban.attention_dropout) == (0.1, 0.4)
    config["model"]["options"]["ban"] = {"hidden_dim": 16}
    with pytest.raises(ValueError, match=r"model\.options\.ban\.hidden_dim: VQA.s BAN works at model\.vqa\.hidden_dim"):
        build_vqa_model(config, 4, 3, 5)


@pytest.mark.parametrize("feature_dim", [None, 3])
def test_streamed_and_in_memory_features_give_the_same_predictions(tmp_path, monkeypatch, feature_dim):
    import polyfuse.data.formats.features as region_features
    from polyfuse.data.formats.features import RegionFeatures
    from polyfuse.tasks.vqa.spec import build_vqa_model

    config = yaml.safe_load((write_vqa_folder(tmp_path, 12, 6) / "vqa.yaml").read_text())
    config["data"]["vqa"]["feature_dim"] = feature_dim
    config = resolve_config(config)
    held = build_vqa_data(config)
    monkeypatch.setattr(region_features, "IN_MEMORY_BYTES", 0)  # every file read per batch
    streamed = build_vqa_data(config)
    assert isinstance(streamed.splits["test"].features, RegionFeatures)
    assert isinstance(held.splits["test"].features, ImageFeatures)
    torch.manual_seed(0)
    model = build_vqa_model(config, len(held.words), len(held.answers), held.image_dim).eval()
    for key in ("train", "val", "test"):
        index = torch.arange(len(held.splits[key]))
        a, b = held.splits[key].batch(index), streamed.splits[key].batch(index)
        torch.testing.assert_close(a["image"], b["image"], rtol=1e-6, atol=1e-6)
        assert all(torch.equal(a[name], b[name]) for name in ("boxes", "tokens", "target", "answer_ids"))
        with torch.no_grad():
            logits_a, _ = model(a["tokens"], a["image"], a["boxes"])
            logits_b, _ = model(b["tokens"], b["image"], b["boxes"])
        assert torch.equal(logits_a.argmax(dim=1), logits_b.argmax(dim=1))
        torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-6)


def test_soft_scores_beside_the_answer_ids_hold_the_dense_soft_targets():
    from polyfuse.data.formats.vqa import soft_targets
    from polyfuse.tasks.vqa.data import answer_table, soft_scores

    questions = random_questions(30, seed=4)
    for rule in ("ban_vqa", "min_third"):
        ids, _ = answer_table(questions, VOCABULARY)
        scores = soft_scores(questions, ids, VOCABULARY, rule)
        dense = torch.zeros(len(questions), len(VOCABULARY))
        for row in range(len(questions)):  # by hand, from the (id, score) pairs
            for answer, score in zip(ids[row].tolist(), scores[row].tolist(), strict=True):
                if answer >= 0:
                    dense[row, answer] = score
        assert torch.equal(dense, soft_targets(questions, VOCABULARY, soft_score=rule))
        assert (ids >= 0).sum() == (dense > 0).sum()
    empty_ids, _ = answer_table([], VOCABULARY)
    assert soft_scores([], empty_ids, VOCABULARY, "ban_vqa").shape == (0, 1)


def _write_annotations(folder, split: str, answers: list[str]) -> None:
    """``split``'s questions and annotations: two questions per image (0, 1, ...), the
    k-th with ten humans giving ``answers[k]``, its multiple-choice answer."""
    import json

    questions, annotations = [], []
    for k, answer in enumerate(answers):
        image_id, question_id = k // 2, 100 * (k // 2) + k % 2
        questions.append({"question_id": question_id, "image_id": image_id, "question": "what is it?"})
        annotations.append({"question_id": question_id, "image_id": image_id, "multiple_choice_answer": answer,
                            "answers": [{"answer": answer}] * 10, "answer_type": "other", "question_type": "what"})
    (folder / f"{split}_questions.json").write_text(json.dumps({"questions": questions}))
    (folder / f"{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))


def test_answers_from_train_val_and_test_by_hand(tmp_path):
    """ban-vqa counts the answers of train2014 and val2014 together (tools/compute_softscore.py):
    data.vqa.answers_from train+val, every annotation file of the run. Counts by hand, at
    min_answer_count 5: the training file (8 images, 16 questions) has cat 6, emu 4, fox 1,
    dog 5; the test file (4 images) emu 1, owl 5, fox 2."""
    config = yaml.safe_load((write_vqa_folder(tmp_path, 8, 4) / "vqa.yaml").read_text())
    _write_annotations(tmp_path, "train", ["cat"] * 6 + ["emu"] * 4 + ["fox"] + ["dog"] * 5)
    _write_annotations(tmp_path, "test", ["emu"] + ["owl"] * 5 + ["fox"] * 2)
    config["data"]["vqa"]["min_answer_count"] = 5
    # the default: the training split only; a quarter of the images (2 of 8) are held out
    # for validation, images 6 and 7 at this split_seed (questions 12-15): four of the dogs
    data = build_vqa_data(resolve_config(config))
    assert sorted({q.image_id for q in data.splits["val"].questions}) == [6, 7]
    assert data.answers == ["cat"]  # cat 6, emu 4, dog 1, fox 1
    # train+val: both files, validation images included: cat 6, then dog 5, emu 4 + 1 and
    # owl 5 (ties alphabetical); fox 1 + 2 = 3 < 5
    config["data"]["vqa"]["answers_from"] = "train+val"
    assert build_vqa_data(resolve_config(config)).answers == ["cat", "dog", "emu", "owl"]
    # the test file is read to count its answers even when the test split is not built
    assert build_vqa_data(resolve_config(config), splits=("train",)).answers == ["cat", "dog", "emu", "owl"]


def test_answer_questions_selects_the_splits():
    train, valid, test = random_questions(3, 0), random_questions(2, 1), random_questions(1, 2)
    assert answer_questions("train", train, valid, test) == train
    assert answer_questions("train+val", train, valid, test) == train + valid + test
    with pytest.raises(ValueError, match=r"answers_from 'val' is not one of train, train\+val$"):
        answer_questions("val", train, valid, test)
