"""Every metric against scikit-learn or a hand computation (STYLE.md habit 6)."""

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, mean_absolute_error

from polyfuse.metrics import (
    ClassificationMetrics,
    SentimentMetrics,
    TraitMetrics,
    classification_metrics,
    round_to_classes,
    sentiment_metrics,
    trait_metrics,
)


def sentiment_data(seed=0, n=300):
    rng = np.random.default_rng(seed)
    target = np.round(rng.uniform(-3, 3, n) * 5) / 5  # steps of 0.2: many exact zeros
    target[:25] = 0.0
    preds = np.clip(target + rng.normal(0, 1.2, n), -3.5, 3.5)
    preds[30:35] = 0.0  # predictions at exactly 0 (has-0: positive; non-0: negative)
    return preds.astype(np.float32), target.astype(np.float32)


def reference_sentiment(preds, target):
    nonzero = target != 0
    return {
        "mae": mean_absolute_error(target, preds),
        "corr": np.corrcoef(preds, target)[0, 1],
        "acc2_has0": accuracy_score(target >= 0, preds >= 0),
        "f1_has0": f1_score(target >= 0, preds >= 0, average="weighted"),
        "acc2_non0": accuracy_score(target[nonzero] > 0, preds[nonzero] > 0),
        "f1_non0": f1_score(target[nonzero] > 0, preds[nonzero] > 0, average="weighted"),
        "acc7": np.mean(np.round(np.clip(preds, -3, 3)) == np.round(np.clip(target, -3, 3))),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sentiment_metrics_match_sklearn(seed):
    preds, target = sentiment_data(seed)
    ours = sentiment_metrics(torch.from_numpy(preds), torch.from_numpy(target))
    reference = reference_sentiment(preds, target)
    assert set(ours) == set(reference)
    for key, value in reference.items():
        assert float(ours[key]) == pytest.approx(value, abs=1e-5), key


def test_has0_and_non0_differ_where_the_conventions_differ():
    # label 0 counts as positive for has-0 and is dropped for non-0;
    # a prediction of exactly 0 is positive for has-0 and negative for non-0.
    preds = torch.tensor([0.0, -1.0, 1.0, 0.0])
    target = torch.tensor([0.0, -2.0, 2.0, 1.0])
    metrics = sentiment_metrics(preds, target)
    assert float(metrics["acc2_has0"]) == pytest.approx(1.0)  # all four agree in sign >= 0
    assert float(metrics["acc2_non0"]) == pytest.approx(2 / 3)  # rows 1-3; row 3 predicts 0 -> negative


def test_acc7_rounds_half_to_even_and_clips():
    values = torch.tensor([0.5, 1.5, -2.5, 3.7, -9.0, 2.49])
    assert round_to_classes(values, -3, 3).tolist() == [3, 5, 1, 6, 0, 5]
    assert np.round(np.clip(values.numpy(), -3, 3)).tolist() == [0, 2, -2, 3, -3, 2]


def test_sentiment_class_accumulates_batches_like_one_call():
    preds, target = sentiment_data(3)
    metric = SentimentMetrics()
    for start in range(0, len(preds), 37):
        metric.update(torch.from_numpy(preds[start : start + 37]), torch.from_numpy(target[start : start + 37]))
    whole = sentiment_metrics(torch.from_numpy(preds), torch.from_numpy(target))
    for key, value in metric.compute().items():
        assert float(value) == pytest.approx(float(whole[key]), abs=1e-6)


def test_trait_metrics_by_hand():
    rng = np.random.default_rng(0)
    target = np.stack([rng.integers(1, 8, 200), rng.integers(1, 6, 200)], axis=1).astype(np.float32)
    preds = (target + rng.normal(0, 0.9, target.shape)).astype(np.float32)
    ranges = [[1, 7], [1, 5]]
    ours = trait_metrics(torch.from_numpy(preds), torch.from_numpy(target), ranges=ranges, names=["con", "pas"])
    for i, (name, (low, high)) in enumerate(zip(["con", "pas"], ranges, strict=True)):
        mae = np.abs(preds[:, i] - target[:, i]).mean()
        accuracy = np.mean(np.round(np.clip(preds[:, i], low, high)) == np.round(np.clip(target[:, i], low, high)))
        classes = high - low + 1
        assert float(ours[f"mae/{name}"]) == pytest.approx(mae, abs=1e-6)
        assert float(ours[f"ma{classes}/{name}"]) == pytest.approx(accuracy, abs=1e-6)
        assert float(ours[f"corr/{name}"]) == pytest.approx(np.corrcoef(preds[:, i], target[:, i])[0, 1], abs=1e-5)
    assert set(ours) == {"mae/con", "ma7/con", "corr/con", "mae/pas", "ma5/pas", "corr/pas", "mae", "ma", "corr"}
    correlations = [np.corrcoef(preds[:, i], target[:, i])[0, 1] for i in range(2)]
    assert float(ours["corr"]) == pytest.approx(np.mean(correlations), abs=1e-5)
    assert float(ours["mae"]) == pytest.approx(np.abs(preds - target).mean(), abs=1e-6)
    metric = TraitMetrics(ranges, ["con", "pas"])
    metric.update(torch.from_numpy(preds[:50]), torch.from_numpy(target[:50]))
    metric.update(torch.from_numpy(preds[50:]), torch.from_numpy(target[50:]))
    assert float(metric.compute()["ma7/con"]) == pytest.approx(float(ours["ma7/con"]))


@pytest.mark.parametrize("absent_class", [False, True])
def test_classification_metrics_match_sklearn(absent_class):
    rng = np.random.default_rng(1)
    target = rng.integers(0, 4, 150)
    preds = np.where(rng.random(150) < 0.6, target, rng.integers(0, 4, 150))
    if absent_class:  # class 3 occurs nowhere: sklearn leaves it out of the macro mean
        target[target == 3] = 2
        preds[preds == 3] = 1
    ours = classification_metrics(torch.from_numpy(preds), torch.from_numpy(target), num_classes=4)
    assert float(ours["acc"]) == pytest.approx(accuracy_score(target, preds), abs=1e-6)
    assert float(ours["f1_macro"]) == pytest.approx(f1_score(target, preds, average="macro"), abs=1e-6)
    scores = torch.nn.functional.one_hot(torch.from_numpy(preds), 4).float() + 0.01
    metric = ClassificationMetrics(4)
    metric.update(scores[:70], torch.from_numpy(target[:70]))
    metric.update(scores[70:], torch.from_numpy(target[70:]))
    assert float(metric.compute()["f1_macro"]) == pytest.approx(float(ours["f1_macro"]), abs=1e-6)


def test_shape_errors():
    with pytest.raises(ValueError, match="differ"):
        sentiment_metrics(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="ranges"):
        trait_metrics(torch.zeros(3, 2), torch.zeros(3, 2), ranges=[[1, 7]], names=["a", "b"])
    metric = SentimentMetrics()
    with pytest.raises(ValueError, match="3 predictions for 2 targets"):
        metric.update(torch.zeros(3), torch.zeros(2))


def test_trait_correlation_of_a_constant_prediction_is_undefined():
    target = torch.tensor([[1.0], [3.0], [5.0]])
    ours = trait_metrics(torch.full((3, 1), 3.0), target, ranges=[[1, 7]], names=["a"])
    assert np.isnan(float(ours["corr/a"])) and np.isnan(float(ours["corr"]))
    assert float(ours["mae"]) == pytest.approx(4 / 3)
