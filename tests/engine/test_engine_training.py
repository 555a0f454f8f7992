"""Training runs: outputs, best-on-validation, seeded determinism, resume,
early stopping, bf16 autocast, and evaluate / predict agreeing with the run."""

import csv
import json

import numpy as np
import pytest
import torch
from tests.helpers.runs import Interrupt

import polyfuse
from polyfuse.engine import evaluate, load_config, predict, read_checkpoint, resolve_config, train
from polyfuse.metrics import classification_metrics, sentiment_metrics


def weights(path):
    return read_checkpoint(path)["state_dict"]


def assert_same_weights(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=key)


def test_run_outputs_and_best_on_validation(tiny_config, tmp_path):
    config = tiny_config(trainer={"max_epochs": 4})
    result = train(config, run_dir=tmp_path / "run")
    run = tmp_path / "run"
    recorded = resolve_config({**config, "polyfuse_version": polyfuse.__version__})  # the run records its version
    assert resolve_config(load_config(run / "config.yaml")) == recorded
    for name in ("checkpoints/best.safetensors", "checkpoints/last.safetensors", "results.json", "learning_curves.png"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("version_0/events.out.tfevents.*"))
    assert (run / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (run / "csv/version_0/metrics.csv").open() as handle:
        losses = [float(r["val/loss"]) for r in csv.DictReader(handle) if r.get("val/loss")]
    assert len(losses) >= 4  # one per epoch, then the final validation of the best checkpoint
    summary = json.loads((run / "results.json").read_text())
    assert summary["monitor"] == "val/loss"
    assert summary["validation"]["loss"] == pytest.approx(min(losses[:4]), abs=1e-6)
    assert summary["test"] == pytest.approx(result.test)
    assert set(result.test) == {"loss", "acc", "f1_macro"}
    stored = read_checkpoint(run / "checkpoints/best.safetensors")["polyfuse"]
    assert stored["config"] == recorded and stored["modalities"] == ["m0", "m1", "m2"]
    assert last_epoch(run) == 3


def last_epoch(run):
    return read_checkpoint(run / "checkpoints/last.safetensors")["epoch"]


def test_same_seed_same_result_other_seed_differs(tiny_config, tmp_path):
    first = train(tiny_config(seed=5), run_dir=tmp_path / "a")
    second = train(tiny_config(seed=5), run_dir=tmp_path / "b")
    other = train(tiny_config(seed=6), run_dir=tmp_path / "c")
    assert first.test == second.test and first.validation == second.validation
    assert_same_weights(weights(first.best_checkpoint), weights(second.best_checkpoint))
    changed = weights(other.best_checkpoint)
    assert any(not torch.equal(changed[k], v) for k, v in weights(first.best_checkpoint).items())


def test_resume_continues_to_the_same_result(tiny_config, tmp_path):
    # Dropout, a cosine schedule and early stopping state all have to survive the restart.
    config = tiny_config(
        optim={"lr": 0.01, "scheduler": "cosine"}, trainer={"max_epochs": 5, "patience": 3},
        model={"dropout": 0.3},
    )
    whole = train(config, run_dir=tmp_path / "whole")
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=tmp_path / "cut", callbacks=[Interrupt(3)])
    assert last_epoch(tmp_path / "cut") == 2
    resumed = train({}, resume=tmp_path / "cut")
    assert resumed.test == whole.test and resumed.validation == whole.validation
    assert_same_weights(weights(tmp_path / "whole/checkpoints/last.safetensors"), weights(tmp_path / "cut/checkpoints/last.safetensors"))
    assert json.loads((tmp_path / "cut/results.json").read_text())["resumed"] is True
    assert (tmp_path / "cut/csv/version_1/metrics.csv").is_file()  # the resumed part logs beside the first


def test_resume_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.yaml"):
        train({}, resume=tmp_path)


def test_early_stopping(tiny_config, tmp_path):
    # With a zero learning rate nothing improves after the first epoch.
    result = train(tiny_config(optim={"lr": 0.0}, trainer={"max_epochs": 8, "patience": 2}), run_dir=tmp_path / "r")
    assert result.epochs == 3


def test_bf16_autocast(tiny_config, tmp_path, training_witness):
    result = train(tiny_config(trainer={"max_epochs": 1, "precision": "bf16-mixed"}), run_dir=tmp_path / "r",
                   callbacks=[training_witness])
    training_witness.assert_trained(loss_falls=False)  # one epoch
    assert all(np.isfinite(v) for v in result.test.values())
    assert all(t.dtype == torch.float32 for k, t in weights(result.best_checkpoint).items()
               if "random_matrix" not in k and t.is_floating_point())  # not MAN's int64 count of draws


def test_bf16_autocast_contextual_sentiment_with_gru_encoders(tiny_config, tmp_path, training_witness):
    """MOSI's setting (configs/mosi/man.yaml): GRU encoders, which autocast leaves in float32
    on the CPU, feed MAN, whose projections run in bfloat16 and whose float32 LSC vectors
    then meet bfloat16 values (it raised a dtype error before the float32 islands)."""
    data = {
        "source": contextual_file(tmp_path / "ctx.npz"), "modalities": ["text", "audio"], "split": "split",
        "id": "segment", "context": {"group_by": "video", "order_by": "start", "window": 5},
        "validation_fraction": 0.25,
    }
    config = tiny_config(task={"type": "sentiment", "loss": "l1"}, data=data,
                         model={"encoder": {"type": "gru"}, "skip": False, "centre_marker": True},
                         trainer={"max_epochs": 2, "precision": "bf16-mixed"})
    result = train(config, run_dir=tmp_path / "r", callbacks=[training_witness])
    training_witness.assert_trained()
    assert all(np.isfinite(v) for v in result.test.values())


def test_evaluate_and_predict_agree_with_the_run(tiny_config, tmp_path):
    result = train(tiny_config(), run_dir=tmp_path / "r")
    assert evaluate(result.best_checkpoint, split="test") == pytest.approx(result.test, abs=1e-6)
    records = predict(result.best_checkpoint, split="test", out=tmp_path / "preds.csv")
    with (tmp_path / "preds.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(records) == 40
    assert set(rows[0]) == {"row", "prediction", "prob_-1.0", "prob_1.0", "label"}
    probabilities = torch.tensor([[float(r["prob_-1.0"]), float(r["prob_1.0"])] for r in rows])
    labels = torch.tensor([0 if float(r["label"]) < 0 else 1 for r in rows])
    ours = classification_metrics(probabilities, labels, num_classes=2)
    assert float(ours["acc"]) == pytest.approx(result.test["acc"], abs=1e-6)
    every = predict(result.best_checkpoint)  # every row of the source
    assert len(every) == 200


def contextual_file(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    video = np.repeat(np.arange(12), 10)
    mood = rng.normal(0, 1.5, 12)[video]
    label = np.clip(mood + rng.normal(0, 0.5, n), -3, 3).astype(np.float32)
    np.savez(
        path,
        text=(label[:, None] * rng.normal(1, 0.1, (1, 6)) + rng.normal(0, 1, (n, 6))).astype(np.float32),
        audio=rng.normal(0, 1, (n, 4)).astype(np.float32),
        label=label,
        video=video.astype(str),
        start=rng.permutation(n).astype(np.float32),
        segment=np.array([f"s{i}" for i in range(n)]),
        split=np.where(video < 9, "train", "test"),
        traits=np.stack([np.clip(np.round(label + 4), 1, 7), np.clip(np.round(label / 2 + 3), 1, 5)], 1).astype(np.float32),
    )
    return str(path)


def test_contextual_sentiment_and_traits_end_to_end(tiny_config, tmp_path):
    source = contextual_file(tmp_path / "ctx.npz")
    data = {
        "source": source, "modalities": ["text", "audio"], "split": "split", "id": "segment",
        "context": {"group_by": "video", "order_by": "start", "window": 5}, "validation_fraction": 0.25,
    }
    config = tiny_config(task={"type": "sentiment"}, data=data, model={"encoder": {"type": "gru"}})
    result = train(config, run_dir=tmp_path / "sentiment")
    assert set(result.test) == {"loss", "mae", "corr", "acc2_has0", "f1_has0", "acc2_non0", "f1_non0", "acc7"}
    records = predict(result.best_checkpoint, split="test", out=tmp_path / "p.csv")
    assert records[0]["id"].startswith("s") and len(records) == 30
    recomputed = sentiment_metrics(torch.tensor([r["prediction"] for r in records]), torch.tensor([r["label"] for r in records]))
    assert float(recomputed["mae"]) == pytest.approx(result.test["mae"], abs=1e-5)
    # A new file with the features and the context keys only: no label, no split.
    with np.load(source) as archive:
        unlabelled = {k: archive[k] for k in ("text", "audio", "video", "start", "segment")}
    np.savez(tmp_path / "new.npz", **unlabelled)
    fresh = predict(result.best_checkpoint, source=str(tmp_path / "new.npz"))
    assert len(fresh) == 120 and "label" not in fresh[0]
    by_id = {r["id"]: r["prediction"] for r in fresh}
    assert all(by_id[r["id"]] == pytest.approx(r["prediction"], abs=1e-5) for r in records)
    traits = train(
        tiny_config(task={"type": "traits", "target_names": ["con", "pas"], "target_ranges": [[1, 7], [1, 5]]}, data={**data, "label": "traits"}),
        run_dir=tmp_path / "traits",
    )
    assert {"mae/con", "ma7/con", "mae/pas", "ma5/pas", "mae", "ma"} <= set(traits.test)


@pytest.mark.parametrize(("limit", "expected"), [(None, 1.0), (1, 0.0)])
def test_the_run_log_says_which_attention_mode_auto_computed(tiny_config, tmp_path, limit, expected):
    """MAN's auto mode: 2 heads x 6 x 7 x 8 = 672 tuples per sample, exact under the default
    budget and had under a budget of 1; metrics.csv records the fraction of exact calls."""
    options = {"hidden_dim": 8, "heads": 2, "num_random_features": 8, "chunks": 4, "exact_limit": limit}
    train(tiny_config(trainer={"max_epochs": 1}, model={"options": {"man": options}}), run_dir=tmp_path / "run")
    with (tmp_path / "run/csv/version_0/metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for key in ("attention/train_exact", "attention/val_exact"):
        logged = [float(row[key]) for row in rows if row.get(key)]
        assert logged and all(value == expected for value in logged), key
