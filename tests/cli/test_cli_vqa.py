"""VQA through the engine's commands (task.type vqa) on a small synthetic VQA set that
can be learnt exactly: the colour asked about is written in the image features."""

from __future__ import annotations

import csv
import json

import h5py
import numpy as np
import pytest
import yaml
from lightning.pytorch.callbacks import Callback

from polyfuse.cli.main import main
from polyfuse.engine.run import train
from polyfuse.metrics.vqa import vqa_accuracy

QUESTIONS = [("what color is the shape?", "color"), ("is the shape red?", "yes/no")]


def _write_split(folder, split, images, generator):
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


def _config(folder, **model):
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
            "vqa": {"hidden_dim": 8, "embedding_dim": 8, "glimpses": 1, "counter_objects": 4, "dropout": 0.0,
                    "attention_dropout": 0.0, "classifier_dropout": 0.0, **model},
            "options": {"concat": {"hidden_dim": 32}},
        },
        "optim": {"lr": 0.02},
        "trainer": {"max_epochs": 20, "patience": 0, "num_threads": 1, "progress_bar": False, "quiet": True},
    }  # fmt: skip


def write_vqa_folder(folder, train_images=24, test_images=8):
    """The two splits' JSON and HDF5 files and ``vqa.yaml`` in ``folder``."""
    generator = np.random.default_rng(0)
    _write_split(folder, "train", train_images, generator)
    _write_split(folder, "test", test_images, generator)
    (folder / "vqa.yaml").write_text(yaml.safe_dump(_config(folder)))
    return folder


@pytest.fixture
def vqa_folder(tmp_path):
    return write_vqa_folder(tmp_path)


def test_vqa_compare_over_models(vqa_folder, capsys):
    nocount = vqa_folder / "ban_nocount.yaml"
    nocount.write_text(yaml.safe_dump({"model": {"fusion": "ban", "vqa": {"counter_objects": None}}}))
    out = vqa_folder / "compare"
    code = main(["compare", "--config", str(vqa_folder / "vqa.yaml"), "--models", f"ban,{nocount},concat",
                 "--seeds", "1", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with (out / "runs.csv").open() as handle:
        runs = list(csv.DictReader(handle))
    assert [r["model"] for r in runs] == ["ban", "ban_nocount", "concat"]
    for run in runs:  # the answer is in the features: every test question right
        assert float(run["acc"]) == 1.0 and float(run["acc/color"]) == 1.0 and float(run["acc/yes/no"]) == 1.0
    table = (out / "summary.md").read_text()
    assert "| model | runs | val acc | test acc | color | yes/no | epochs | s / run |" in table
    assert "| ban | 1 | 100.00 ± 0.00 | 100.00 ± 0.00 | 100.00 ± 0.00 | 100.00 ± 0.00 |" in table
    assert (out / "summary.png").stat().st_size > 0


def test_vqa_train_evaluate_predict_plot(vqa_folder, capsys):
    run = vqa_folder / "run"
    assert main(["train", "--config", str(vqa_folder / "vqa.yaml"), "--max-epochs", "4", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["monitor"] == "val/acc" and results["mode"] == "max"
    assert results["samples"] == {"train": 36, "valid": 12, "test": 16}  # 18 / 6 training images, 2 questions each
    best = run / "checkpoints" / "best.safetensors"
    metrics = vqa_folder / "metrics.json"
    assert main(["evaluate", "--checkpoint", str(best), "--out", str(metrics)]) == 0
    evaluated = json.loads(metrics.read_text())
    assert evaluated["acc"] == pytest.approx(results["test"]["acc"], abs=1e-6)
    predictions = vqa_folder / "predictions.csv"
    assert main(["predict", "--checkpoint", str(best), "--split", "test", "--out", str(predictions)]) == 0
    with predictions.open() as handle:
        records = list(csv.DictReader(handle))
    humans = {q["question_id"]: q for q in json.loads((vqa_folder / "test_annotations.json").read_text())["annotations"]}
    # oracle: the official accuracy of each predicted answer, computed here from the annotations
    scores = [vqa_accuracy(r["answer"], [a["answer"] for a in humans[int(r["question_id"])]["answers"]]) for r in records]
    assert [float(r["accuracy"]) for r in records] == pytest.approx(scores)
    assert np.mean(scores) == pytest.approx(evaluated["acc"], abs=1e-6)
    for kind in ("color", "yes/no"):
        mine = [s for s, r in zip(scores, records, strict=True) if r["type"] == kind]
        assert np.mean(mine) == pytest.approx(evaluated[f"acc/{kind}"], abs=1e-6)

    figure = vqa_folder / "attention.png"
    assert main(["plot", "attention", "--checkpoint", str(best), "--question-ids", "0,11", "--out", str(figure)]) == 0
    assert (vqa_folder / "attention_0.png").stat().st_size > 0 and (vqa_folder / "attention_11.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["plot", "attention", "--checkpoint", str(best), "--question-ids", "3", "--out", str(figure)]) == 2
    assert "question id(s) [3] are not in the test split" in capsys.readouterr().err
    assert main(["plot", "attention", "--run", str(run), "--out", str(figure)]) == 2
    assert "plot attention reads a checkpoint" in capsys.readouterr().err


def test_vqa_input_errors_are_named(vqa_folder, capsys):
    with h5py.File(vqa_folder / "test.h5", "a") as handle:
        handle["image_ids"][3] = 99
    assert main(["train", "--config", str(vqa_folder / "vqa.yaml"), "--out", str(vqa_folder / "o")]) == 2
    assert "test.h5: no features for image id(s) [3]" in capsys.readouterr().err
    with h5py.File(vqa_folder / "test.h5", "a") as handle:
        handle["image_ids"][3] = 3

    config = _config(vqa_folder, glove=str(vqa_folder / "glove.840B.300d.txt"))
    (vqa_folder / "glove.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "glove.yaml"), "--out", str(vqa_folder / "g")]) == 2
    assert "glove.840B.300d.txt does not exist" in capsys.readouterr().err

    del config["data"]["vqa"]
    (vqa_folder / "novqa.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "novqa.yaml")]) == 2
    assert "task.type vqa needs a data.vqa section" in capsys.readouterr().err

    config = _config(vqa_folder)
    config["data"]["vqa"]["min_answers"] = 3
    (vqa_folder / "typo.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "typo.yaml")]) == 2
    assert "unknown config key 'data.vqa.min_answers' (did you mean 'min_answer_count'?)" in capsys.readouterr().err


class _Interrupt(Callback):
    """Fails at the start of an epoch, as a killed run would."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 2:
            raise RuntimeError("interrupted")


def test_vqa_resume_continues_to_the_same_result(vqa_folder):
    config = _config(vqa_folder, dropout=0.3, classifier_dropout=0.3)
    config["trainer"]["max_epochs"] = 4
    whole = train(config, run_dir=vqa_folder / "whole")
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=vqa_folder / "cut", callbacks=[_Interrupt()])
    resumed = train({}, resume=vqa_folder / "cut")
    assert resumed.test == whole.test and resumed.validation == whole.validation
    assert resumed.epochs == whole.epochs


@pytest.mark.parametrize("fusion", ["ban", "man"])
def test_vqa_trains_in_bf16_mixed(vqa_folder, training_witness, fusion):
    """precision: bf16-mixed through the engine: BAN with its counter (float32 inside), or MAN."""
    config = _config(vqa_folder)
    config["model"]["fusion"] = fusion
    config["model"]["options"]["man"] = {"hidden_dim": 8, "heads": 2, "num_random_features": 8}
    config["trainer"].update(max_epochs=4, precision="bf16-mixed")
    result = train(config, run_dir=vqa_folder / fusion, callbacks=[training_witness])
    training_witness.assert_trained()
    assert all(np.isfinite(value) for value in result.test.values())
