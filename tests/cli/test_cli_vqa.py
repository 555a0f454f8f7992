"""VQA through the engine's commands (task.type vqa) on a small synthetic VQA set that
can be learnt exactly: the colour asked about is written in the image features."""

from __future__ import annotations

import csv
import json

import h5py
import numpy as np
import pytest
import yaml
from tests.helpers.runs import Interrupt
from tests.tiny.vqa import vqa_config, write_vqa_folder

from polyfuse.cli.main import main
from polyfuse.engine.run import train
from polyfuse.metrics.vqa import vqa_accuracy


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
    assert results["samples"] == {"train": 36, "val": 12, "test": 16}  # 18 / 6 training images, 2 questions each
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

    config = vqa_config(vqa_folder, glove=str(vqa_folder / "glove.840B.300d.txt"))
    (vqa_folder / "glove.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "glove.yaml"), "--out", str(vqa_folder / "g")]) == 2
    assert "glove.840B.300d.txt does not exist" in capsys.readouterr().err

    del config["data"]["vqa"]
    (vqa_folder / "novqa.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "novqa.yaml")]) == 2
    assert "task.type vqa needs a data.vqa section" in capsys.readouterr().err

    config = vqa_config(vqa_folder)
    config["data"]["vqa"]["min_answers"] = 3
    (vqa_folder / "typo.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(vqa_folder / "typo.yaml")]) == 2
    assert "unknown config key 'data.vqa.min_answers' (did you mean 'min_answer_count'?)" in capsys.readouterr().err


def test_vqa_resume_continues_to_the_same_result(vqa_folder):
    config = vqa_config(vqa_folder, ban={"dropout": 0.3}, classifier_dropout=0.3)
    config["trainer"]["max_epochs"] = 4
    whole = train(config, run_dir=vqa_folder / "whole")
    with pytest.raises(RuntimeError, match="interrupted"):
        train(config, run_dir=vqa_folder / "cut", callbacks=[Interrupt(2)])
    resumed = train({}, resume=vqa_folder / "cut")
    assert resumed.test == whole.test and resumed.validation == whole.validation
    assert resumed.epochs == whole.epochs


@pytest.mark.parametrize("fusion", ["ban", "man"])
def test_vqa_trains_in_bf16_mixed(vqa_folder, training_witness, fusion):
    """precision: bf16-mixed through the engine: BAN with its counter (float32 inside), or MAN."""
    config = vqa_config(vqa_folder)
    config["model"]["fusion"] = fusion
    config["model"]["options"]["man"] = {"hidden_dim": 8, "heads": 2, "num_random_features": 8}
    config["trainer"].update(max_epochs=4, precision="bf16-mixed")
    result = train(config, run_dir=vqa_folder / fusion, callbacks=[training_witness])
    training_witness.assert_trained()
    assert all(np.isfinite(value) for value in result.test.values())
