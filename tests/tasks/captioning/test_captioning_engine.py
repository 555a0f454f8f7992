"""task.type captioning in the engine: train / evaluate / predict / compare on tiny files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tests.helpers.runs import best_epoch_of_log
from tests.tiny.captioning import captioning_config_file, write_captioning_data

from polyfuse.cli.main import main
from polyfuse.metrics.captioning import caption_metrics


def test_train_evaluate_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_captioning_data(tmp_path)
    config = captioning_config_file(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    generated = json.loads((run / "test_captions.json").read_text())
    assert sorted(generated) == ["vid10", "vid11"]
    # The logged test metrics are pycocoevalcap's scores of the captions written beside them.
    expected = caption_metrics({v: g["references"] for v, g in generated.items()},
                               {v: g["generated"] for v, g in generated.items()}, meteor=False)
    for key in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"):
        assert results["test"][key] == pytest.approx(expected[key], abs=1e-6)
    assert results["vocabulary"] == 4 + 4 + 5  # specials, the 4 nouns, a is here the moves
    # the best checkpoint's epoch is the one of the log's best validation monitor (issue 28)
    assert results["best_epoch"] == best_epoch_of_log(run, results["monitor"], results["mode"], results["epochs"])
    assert f"(epoch {results['best_epoch']} of {results['epochs']} trained, " in capsys.readouterr().out
    checkpoint = run / results["best_checkpoint"]
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "m.json")]) == 0
    evaluated = json.loads((tmp_path / "m.json").read_text())
    assert evaluated["CIDEr-D"] == pytest.approx(results["test"]["CIDEr-D"], abs=1e-6)
    out = tmp_path / "predicted.json"
    assert main(["predict", "--checkpoint", str(checkpoint), "--split", "test", "--out", str(out)]) == 0
    predicted = json.loads(out.read_text())
    assert predicted == {v: g["generated"] for v, g in generated.items()}
    # The figure's data: the generated words (and <eos>), attention summing to one per word.
    from polyfuse.engine.run import load_model
    from polyfuse.engine.rundir import best_checkpoint
    from polyfuse.tasks.captioning.figure import caption_attention
    from polyfuse.tasks.captioning.spec import checkpoint_captioning_data

    task, extras = load_model(best_checkpoint(run))
    found = caption_attention(task, extras, "vid10", checkpoint_captioning_data(extras))
    assert found["caption"] == predicted["vid10"] and found["split"] == "test"
    assert " ".join(w for w in found["words"] if w != "<eos>") == predicted["vid10"]
    for attention in found["attention"]:
        assert attention.shape[0] == len(found["words"])
        np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(found["modality_weights"].sum(axis=1), 1.0, atol=1e-5)
    assert main(["plot", "--captions", str(run), "--video", "vid10", "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_missing_features_error_or_skip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_captioning_data(tmp_path)
    splits = json.loads((tmp_path / "splits.json").read_text())
    splits["train"].append("ghost")
    captions = json.loads((tmp_path / "captions.json").read_text())
    captions["ghost"] = ["a ghost"]
    (tmp_path / "splits.json").write_text(json.dumps(splits))
    (tmp_path / "captions.json").write_text(json.dumps(captions))
    assert main(["train", "--config", str(captioning_config_file(tmp_path)), "--out", str(tmp_path / "a")]) == 2
    error = capsys.readouterr().err
    assert "video 'ghost' of the train split" in error and "appearance" in error and "missing_features: skip" in error
    config = captioning_config_file(tmp_path, missing_features="skip")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "b"), "--set", "trainer.max_epochs=1"]) == 0
    said = "captioning: skipped videos without captions or features: 1 of train"
    assert f"polyfuse train: warning: {said}\n" in capsys.readouterr().err  # one line (polyfuse.cli.main)
    assert json.loads((tmp_path / "b" / "results.json").read_text())["skipped_videos"]["train"] == 1


def test_compare_variants(tmp_path: Path) -> None:
    write_captioning_data(tmp_path)
    config = captioning_config_file(tmp_path)
    variants = []
    for name in ("mean-pool", "HOCA-UB"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"decoder": {"variant": name}}))
        variants.append(str(path))
    out = tmp_path / "compare"
    assert main(["compare", "--config", str(config), "--models", ",".join(variants), "--seeds", "2",
                 "--out", str(out), "--set", "trainer.max_epochs=1"]) == 0
    table = (out / "summary.md").read_text()
    assert "mean-pool (n=2)" in table and "HOCA-UB (n=2)" in table and "CIDEr-D" in table
    runs = (out / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 4


def test_trains_in_bf16_mixed(tmp_path: Path, training_witness) -> None:
    """precision: bf16-mixed through the engine (L-HOCA-UBT): teacher forcing under autocast,
    beam search (its log-softmax in float32) for the validation and test captions."""
    from polyfuse.engine import load_config, train

    write_captioning_data(tmp_path)
    config = load_config(captioning_config_file(tmp_path))
    config["trainer"].update(max_epochs=3, precision="bf16-mixed")
    result = train(config, run_dir=tmp_path / "run", callbacks=[training_witness])
    training_witness.assert_trained()
    assert all(np.isfinite(value) for value in result.test.values())


def test_word_vectors_initialise_the_embedding_and_the_reference_oov_is_counted(tmp_path: Path) -> None:
    from polyfuse.engine import load_config, resolve_config
    from polyfuse.tasks.captioning.spec import (
        build_captioning_data,
        build_captioning_task,
        initialise_word_embeddings,
    )

    write_captioning_data(tmp_path)
    (tmp_path / "vectors.txt").write_text("dog " + " ".join(["0.5"] * 8) + "\nman " + " ".join(["-1"] * 8) + "\n")
    config = captioning_config_file(tmp_path)
    content = yaml.safe_load(config.read_text())
    content["decoder"].update(word_vectors="glove", word_vectors_file="vectors.txt")  # relative to the file
    config.write_text(yaml.safe_dump(content))
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run), "--set", "trainer.max_epochs=1"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["word_vectors"] == {"source": "glove", "found": 2, "words": 9}
    # test videos 10 and 11: "A car is here." and "the car moves", "A man ..." -> 14 tokens, all known
    assert results["test_reference_oov"] == {"tokens": 14, "unknown": 0, "rate": 0.0}
    # Before training, the rows of the two words are their vectors.
    resolved = resolve_config(load_config(config))
    data = build_captioning_data(resolved)
    task = build_captioning_task(resolved, data.input_dims, data.max_lengths, data.vocabulary)
    initialise_word_embeddings(task, resolved["decoder"], 0)
    weight = task.model.decoder.embedding.weight
    assert torch.equal(weight[data.vocabulary.index["dog"]], torch.full((8,), 0.5))
    assert torch.equal(weight[data.vocabulary.index["man"]], torch.full((8,), -1.0)) and not weight[0].any()
