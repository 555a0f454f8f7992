"""Compare tables for many targets: averages first, one table per per-target metric,
one unit per column; the constant-prediction baseline computed by hand."""

import numpy as np
import pytest

from polyfuse.engine.compare import constant_baseline, constant_baselines, format_summary, summarise
from polyfuse.engine.config import resolve_config


def test_many_targets_give_a_summary_and_per_target_tables():
    records = [
        {"model": "mult", "seed": s, "epochs": 1, "seconds": 2.0, "val_mae": 0.5, "mae": 0.4 + s / 10,
         "corr": 0.1, "ma": 0.3, "mae/a": 0.3, "corr/a": 0.2, "ma7/a": 0.25, "mae/b": 0.5, "corr/b": 0.0, "ma7/b": 0.35}
        for s in (0, 1)
    ]
    table = format_summary(summarise(records, validation_key="val_mae"),
                           {"mae": 0.9, "corr": float("nan"), "ma": 0.2, "mae/a": 1.0, "corr/a": float("nan"),
                            "ma7/a": 0.1, "mae/b": 0.8, "corr/b": float("nan"), "ma7/b": 0.3})
    first, *rest = table.split("\n\n")
    assert first.splitlines()[0] == "| model | val MAE | MAE | Corr | MA | s / run |"
    assert "| mult (n=2) | 0.500 ± 0.000 | 0.450 ± 0.071 | 0.100 ± 0.000 | 30.0 ± 0.0 | 2 |" in first
    assert "| constant (train mean) | – | 0.900 ± 0.000 | – | 20.0 ± 0.0 | – |" in first  # one dict: the mean's
    assert rest[0] == "Per target: MAE" and rest[1].splitlines()[0] == "| model | a | b |"
    assert "| mult (n=2) | 0.300 ± 0.000 | 0.500 ± 0.000 |" in rest[1]
    assert rest[4] == "Per target: ma7 (%)" and "| constant (train mean) | 10.0 ± 0.0 | 30.0 ± 0.0 |" in rest[5]


def test_constant_baseline_predicts_the_training_mean(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.uniform(1, 7, size=(40, 2)).astype(np.float32)
    split = np.array(["train"] * 24 + ["val"] * 6 + ["test"] * 10)
    np.savez(tmp_path / "d.npz", a=rng.normal(size=(40, 3)).astype(np.float32),
             b=rng.normal(size=(40, 2)).astype(np.float32), label=labels, split=split)
    config = resolve_config({
        "task": {"type": "traits", "target_names": ["x", "y"], "target_ranges": [[1, 7], [1, 7]]},
        "data": {"source": str(tmp_path / "d.npz"), "modalities": ["a", "b"], "split": "split"},
    })
    baseline = constant_baseline(config)
    train_mean = labels[:24].mean(axis=0)
    for i, name in enumerate(["x", "y"]):
        assert baseline[f"mae/{name}"] == pytest.approx(np.abs(labels[30:, i] - train_mean[i]).mean(), abs=1e-5)
        assert baseline[f"ma7/{name}"] == pytest.approx(np.mean(np.round(labels[30:, i]) == np.round(train_mean[i])))
        assert np.isnan(baseline[f"corr/{name}"])


def test_the_median_row_is_the_constant_to_beat_on_mae(tmp_path):
    """Skewed labels: the training median's MAE is below the training mean's; both rows are
    shown, named, each computed by hand."""
    rng = np.random.default_rng(1)
    labels = np.concatenate([rng.uniform(-0.5, 0.5, 30), rng.uniform(2.0, 3.0, 10)]).astype(np.float32)
    rng.shuffle(labels)
    split = np.array(["train"] * 28 + ["val"] * 4 + ["test"] * 8)
    np.savez(tmp_path / "s.npz", a=rng.normal(size=(40, 3)).astype(np.float32),
             b=rng.normal(size=(40, 2)).astype(np.float32), label=labels, split=split)
    config = resolve_config({
        "task": {"type": "sentiment"}, "data": {"source": str(tmp_path / "s.npz"), "modalities": ["a", "b"], "split": "split"},
    })
    rows = constant_baselines(config)
    assert list(rows) == ["constant (train median)", "constant (train mean)"]
    train, test = labels[:28].astype(np.float64), labels[32:].astype(np.float64)
    by_hand = {"median": np.abs(test - np.median(train)).mean(), "mean": np.abs(test - train.mean()).mean()}
    assert rows["constant (train median)"]["mae"] == pytest.approx(by_hand["median"], abs=1e-5)
    assert rows["constant (train mean)"]["mae"] == pytest.approx(by_hand["mean"], abs=1e-5)
    assert by_hand["median"] < by_hand["mean"] - 0.1  # the mean's row flatters a model on MAE
    # on the training labels the median is the best constant for MAE, the mean for MSE
    grid = np.linspace(-1, 3, 4001)
    assert np.abs(train - np.median(train)).mean() <= min(np.abs(train - c).mean() for c in grid) + 1e-12
    assert ((train - train.mean()) ** 2).mean() <= min(((train - c) ** 2).mean() for c in grid) + 1e-12
    table = format_summary(summarise([{"model": "m", "seed": 0, "epochs": 1, "seconds": 1.0, "mae": 0.5}]), rows)
    assert "| constant (train median) | " in table and "| constant (train mean) | " in table
    assert constant_baseline(config, "median")["mae"] == rows["constant (train median)"]["mae"]
    # equal statistics: one row, named so
    symmetric = np.tile(np.array([-1.0, 0.0, 1.0, 0.0], dtype=np.float32), 10)
    np.savez(tmp_path / "s.npz", a=rng.normal(size=(40, 3)).astype(np.float32),
             b=rng.normal(size=(40, 2)).astype(np.float32), label=symmetric, split=split)
    assert list(constant_baselines(config)) == ["constant (train mean = median)"]
