"""`polyfuse vqa` end to end on a small synthetic VQA set that can be learnt exactly:
the colour asked about is written in the image features."""

from __future__ import annotations

import json

import h5py
import numpy as np

from polyfuse.cli.main import main


def _write_split(folder, split, images, generator):
    questions, annotations = [], []
    features = np.zeros((images, 16, 6), dtype=np.float16)
    for image_id in range(images):
        colour = image_id % 2
        features[image_id, :, 0] = 1.0 if colour else -1.0
        features[image_id, :, 1:] = generator.normal(size=(16, 5)) * 0.1
        for k, text in enumerate(["what color is the shape?", "what is the color of the shape?"]):
            question_id = 10 * image_id + k
            answer = "red" if colour else "blue"
            questions.append({"question_id": question_id, "image_id": image_id, "question": text})
            annotations.append(
                {"question_id": question_id, "image_id": image_id, "answers": [{"answer": answer}] * 10,
                 "answer_type": "other", "question_type": "color"}
            )  # fmt: skip
    (folder / f"{split}_questions.json").write_text(json.dumps({"questions": questions}))
    (folder / f"{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))
    with h5py.File(folder / f"{split}.h5", "w") as handle:
        handle["features"] = features
        corners = generator.uniform(size=(images, 16, 2)).astype(np.float32)
        handle["boxes"] = np.concatenate([corners, corners + 0.1], axis=-1)
        handle["image_ids"] = np.arange(images)


def test_vqa_compare_train_and_attention(tmp_path, capsys):
    generator = np.random.default_rng(0)
    _write_split(tmp_path, "train", 24, generator)
    _write_split(tmp_path, "test", 8, generator)
    common = [
        "--data", str(tmp_path), "--train-features", str(tmp_path / "train.h5"),
        "--test-features", str(tmp_path / "test.h5"), "--hidden-dim", "8", "--glimpses", "1",
        "--epochs", "25", "--lr", "0.02", "--min-answer-count", "1", "--dropout", "0",
    ]  # fmt: skip
    out = tmp_path / "compare"
    assert main(["vqa", "compare", *common, "--models", "ban,concat", "--seeds", "1", "--out", str(out)]) == 0
    runs = json.loads((out / "runs.json").read_text())
    assert [r["model"] for r in runs] == ["ban", "concat"]
    for run in runs:  # the answer is in the features: every test question right
        assert run["overall"] == 100.0 and run["per_question_type"] == {"color": 100.0}
    assert (out / "summary.png").stat().st_size > 0
    assert "| ban | 1 | 100.00 | 100.00 |" in (out / "summary.md").read_text()

    checkpoint = tmp_path / "ban.pt"
    assert main(["vqa", "train", *common, "--model", "ban", "--out", str(checkpoint)]) == 0
    assert main(["vqa", "attention", "--checkpoint", str(checkpoint), "--data", str(tmp_path),
                 "--test-features", str(tmp_path / "test.h5"), "--question-ids", "0,11",
                 "--out", str(tmp_path / "maps")]) == 0  # fmt: skip
    assert (tmp_path / "maps" / "attention_11.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["vqa", "attention", "--checkpoint", str(checkpoint), "--data", str(tmp_path),
                 "--test-features", str(tmp_path / "test.h5"), "--question-ids", "3",
                 "--out", str(tmp_path / "maps")]) == 2  # fmt: skip
    assert "question ids [3] are not in" in capsys.readouterr().err


def test_vqa_missing_features_are_named(tmp_path, capsys):
    generator = np.random.default_rng(1)
    _write_split(tmp_path, "train", 4, generator)
    _write_split(tmp_path, "test", 4, generator)
    with h5py.File(tmp_path / "test.h5", "a") as handle:
        handle["image_ids"][3] = 99
    code = main(["vqa", "compare", "--data", str(tmp_path), "--train-features", str(tmp_path / "train.h5"),
                 "--test-features", str(tmp_path / "test.h5"), "--min-answer-count", "1", "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    assert "no features for image id(s) [3]" in capsys.readouterr().err


def test_vqa_missing_glove_file_is_named(tmp_path, capsys):
    generator = np.random.default_rng(2)
    _write_split(tmp_path, "train", 4, generator)
    _write_split(tmp_path, "test", 4, generator)
    code = main(["vqa", "train", "--data", str(tmp_path), "--train-features", str(tmp_path / "train.h5"),
                 "--test-features", str(tmp_path / "test.h5"), "--min-answer-count", "1",
                 "--glove", str(tmp_path / "glove.840B.300d.txt"), "--out", str(tmp_path / "m.pt")])  # fmt: skip
    assert code == 2
    assert "glove.840B.300d.txt does not exist" in capsys.readouterr().err
