"""ban-vqa's layouts through the engine (issue 28): the ``--op c`` question encoder
(``model.vqa.second_embedding_dim``) trained from a configuration and a ban-vqa model
of that layout carried through a polyfuse checkpoint into ``polyfuse predict``; the
adaptive bottom-up features file as training data (``data.vqa.train_features_index``);
the top-k answers of ``predict``."""

from __future__ import annotations

import csv
import json

import h5py
import numpy as np
import pytest
import torch
import yaml
from tests.helpers.ban_vqa import ban_vqa_state
from tests.tiny.vqa import vqa_config, write_vqa_folder

from polyfuse.cli.main import main
from polyfuse.engine.checkpoints import load_state, read_checkpoint, write_checkpoint
from polyfuse.engine.run import train
from polyfuse.interop import load_ban_vqa

# The --op c model of these tests: E = E2 = 4, H = 6, 2 glimpses, ban-vqa's counter of 10.
OP_C = {"embedding_dim": 4, "second_embedding_dim": 4, "hidden_dim": 6, "counter_objects": 10, "ban": {"glimpses": 2}}
MAX_LENGTH = 14  # data.vqa.max_length's default


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _hand_tokens(text: str, words: list[str]) -> list[int]:
    """The test questions' encoding written out: lower-case words without '?', padded
    with index V (the checkpoint's words hold every word of these questions)."""
    indices = [words.index(word) for word in text.rstrip("?").split()]
    return indices + [len(words)] * (MAX_LENGTH - len(indices))


def _reference_answers(model, folder, words, answers, split="test"):
    """{question id: (logits (A,),)} of ``model`` run on the questions and the HDF5 features
    of ``split`` read here, without the engine's data code."""
    questions = json.loads((folder / f"{split}_questions.json").read_text())["questions"]
    with h5py.File(folder / f"{split}.h5", "r") as handle:
        features = torch.from_numpy(handle["features"][:].astype(np.float32))
        boxes = torch.from_numpy(handle["boxes"][:].astype(np.float32))
        rows = {int(i): r for r, i in enumerate(handle["image_ids"][:])}
    tokens = torch.tensor([_hand_tokens(q["question"], words) for q in questions])
    index = torch.tensor([rows[q["image_id"]] for q in questions])
    with torch.no_grad():
        logits, _ = model.eval()(tokens, features[index], boxes[index])
    return {q["question_id"]: logits[i].double() for i, q in enumerate(questions)}


def test_second_embedding_trains_from_a_config_and_a_ban_vqa_op_c_model_round_trips(tmp_path, training_witness, capsys):
    folder = write_vqa_folder(tmp_path)
    config = vqa_config(folder, **OP_C)
    config["trainer"]["max_epochs"] = 2
    train(config, run_dir=folder / "run", callbacks=[training_witness])
    training_witness.assert_trained(loss_falls=False)
    # the second embedding trains, and the GRU reads E + E2 = 8 values per word
    name = "model.question.second_embedding.weight"
    assert not torch.equal(training_witness.before[name], training_witness.after[name])
    best = folder / "run" / "checkpoints" / "best.safetensors"
    state, extras = load_state(best)
    words, answers = extras["label_info"]["words"], extras["label_info"]["answers"]
    assert tuple(state[name].shape) == (len(words) + 1, 4)
    assert tuple(state["model.question.gru.weight_ih_l0"].shape) == (3 * 6, 8)

    # A ban-vqa --op c BanModel of the run's sizes (image features of 6 values), loaded by
    # load_ban_vqa: its weights have exactly the keys and shapes of the configured model.
    reference = ban_vqa_state(op_c=True, glimpses=2, words=len(words), hidden=6, answers=len(answers),
                               image_dim=6, embedding_dim=4, seed=7)  # fmt: skip
    loaded = load_ban_vqa(reference).eval()
    ours = {key.removeprefix("model."): tuple(value.shape) for key, value in state.items()}
    assert {key: tuple(value.shape) for key, value in loaded.state_dict().items()} == ours

    # ... so it goes into a polyfuse checkpoint, and predict answers with its weights
    checkpoint = read_checkpoint(best)
    checkpoint["state_dict"] = {f"model.{key}": value for key, value in loaded.state_dict().items()}
    converted = folder / "ban_vqa_op_c.safetensors"
    write_checkpoint(checkpoint, converted)
    out = folder / "answers.csv"
    assert main(["predict", "--checkpoint", str(converted), "--split", "test", "--out", str(out)]) == 0
    records = _rows(out)
    expected = _reference_answers(loaded, folder, words, answers)
    assert len(records) == len(expected) == 16
    for record in records:
        logits = expected[int(record["question_id"])]
        assert record["answer"] == answers[int(logits.argmax())]
        assert float(record["score"]) == pytest.approx(float(torch.sigmoid(logits.max())), abs=2e-6)
    # evaluate reads the same weights (a checkpoint not of this layout would be refused)
    metrics = folder / "metrics.json"
    assert main(["evaluate", "--checkpoint", str(converted), "--out", str(metrics)]) == 0
    assert 0.0 <= json.loads(metrics.read_text())["acc"] <= 1.0

    # --top-k 3: the three largest logits, best first, each scored by its sigmoid (the
    # model is trained with a binary cross-entropy per answer); the first as with k = 1
    top = folder / "top3.csv"
    assert main(["predict", "--checkpoint", str(converted), "--split", "test", "--top-k", "3", "--out", str(top)]) == 0
    ranked = _rows(top)
    assert list(ranked[0]) == [*list(records[0]), "answer_2", "score_2", "answer_3", "score_3"]
    for one, three in zip(records, ranked, strict=True):
        assert {key: three[key] for key in one} == one  # today's columns unchanged
        logits = expected[int(three["question_id"])]
        order = sorted(range(len(answers)), key=lambda a: -float(logits[a]))[:3]
        names = [three["answer"], three["answer_2"], three["answer_3"]]
        scores = [float(three["score"]), float(three["score_2"]), float(three["score_3"])]
        assert names == [answers[a] for a in order]
        assert scores == pytest.approx([1 / (1 + np.exp(-float(logits[a]))) for a in order], abs=2e-6)
        assert scores == sorted(scores, reverse=True)
    assert main(["predict", "--checkpoint", str(converted), "--split", "test", "--top-k", str(len(answers) + 1),
                 "--out", str(top)]) == 2  # fmt: skip
    assert f"--top-k must be an integer in [1, {len(answers)}] (the checkpoint's answers), got {len(answers) + 1}" in (
        capsys.readouterr().err
    )


def test_second_embedding_dim_is_checked_by_the_schema(tmp_path, capsys):
    folder = write_vqa_folder(tmp_path, train_images=4, test_images=2)
    config = vqa_config(folder, second_embedding_dim=0)
    (folder / "bad.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(folder / "bad.yaml")]) == 2
    assert "model.vqa.second_embedding_dim" in capsys.readouterr().err


def _adaptive_copy(folder, split: str) -> None:
    """``<split>_adaptive.h5`` + ``<split>_index.json``: ``<split>.h5`` in ban-vqa's
    adaptive layout (image id i keeps its first 16 - i % 4 boxes, the images stacked in
    reverse id order, so the index is no identity), and the oracle ``<split>_padded.h5``:
    the same boxes in the polyfuse layout, the dropped boxes all zero."""
    with h5py.File(folder / f"{split}.h5", "r") as handle:
        features, boxes = handle["features"][:].astype(np.float32), handle["boxes"][:]
        ids = handle["image_ids"][:].tolist()
    stacked_features, stacked_boxes, pos_boxes, index = [], [], [], {}
    for row, image in enumerate(reversed(range(len(ids)))):
        kept = 16 - ids[image] % 4
        start = sum(len(f) for f in stacked_features)
        stacked_features.append(features[image, :kept])
        corners = boxes[image, :kept]
        stacked_boxes.append(np.concatenate([corners, corners[:, 2:] - corners[:, :2]], axis=1))  # x1 y1 x2 y2 w h
        pos_boxes.append([start, start + kept])
        index[str(ids[image])] = row
        features[image, kept:], boxes[image, kept:] = 0.0, 0.0
    with h5py.File(folder / f"{split}_adaptive.h5", "w") as handle:
        handle["image_features"] = np.concatenate(stacked_features)
        handle["spatial_features"] = np.concatenate(stacked_boxes)
        handle["image_bb"] = 64 * np.concatenate(stacked_boxes)[:, :4]
        handle["pos_boxes"] = np.array(pos_boxes, dtype=np.int64)
    (folder / f"{split}_index.json").write_text(json.dumps(index))
    with h5py.File(folder / f"{split}_padded.h5", "w") as handle:
        handle["features"], handle["boxes"], handle["image_ids"] = features, boxes, np.array(ids)


def _bottom_up_config(folder, *, indexed: bool = True) -> dict:
    config = vqa_config(folder)
    config["trainer"]["max_epochs"] = 2
    for split in ("train", "test"):
        config["data"]["vqa"][f"{split}_features"] = str(folder / f"{split}_adaptive.h5")
        if indexed:
            config["data"]["vqa"][f"{split}_features_index"] = str(folder / f"{split}_index.json")
    return config


def test_training_reads_ban_vqa_adaptive_features_from_the_config(tmp_path, capsys):
    """Oracle: the same boxes written in the polyfuse layout (padded with zero rows by
    hand) train to the same validation and test scores and the same predictions."""
    folder = write_vqa_folder(tmp_path, train_images=16, test_images=4)
    for split in ("train", "test"):
        _adaptive_copy(folder, split)
    padded = vqa_config(folder)
    padded["trainer"]["max_epochs"] = 2
    for split in ("train", "test"):
        padded["data"]["vqa"][f"{split}_features"] = str(folder / f"{split}_padded.h5")
    expected = train(padded, run_dir=folder / "padded")
    adaptive = train(_bottom_up_config(folder), run_dir=folder / "adaptive")
    assert adaptive.validation == expected.validation and adaptive.test == expected.test
    answers = {}
    for name in ("padded", "adaptive"):
        out = folder / f"{name}.csv"
        best = folder / name / "checkpoints" / "best.safetensors"
        assert main(["predict", "--checkpoint", str(best), "--split", "test", "--out", str(out)]) == 0
        answers[name] = _rows(out)
    assert answers["adaptive"] == answers["padded"] and len(answers["adaptive"]) == 8
    capsys.readouterr()

    # without the index the file is named and the key to set
    (folder / "noindex.yaml").write_text(yaml.safe_dump(_bottom_up_config(folder, indexed=False)))
    assert main(["train", "--config", str(folder / "noindex.yaml"), "--out", str(folder / "o1")]) == 2
    assert ("data.vqa.train_features " + str(folder / "train_adaptive.h5") + " is a bottom-up features file of ban-vqa"
            in capsys.readouterr().err)  # fmt: skip
    # bad pos_boxes still name the row and the image id (row 2 of pos_boxes holds image id 13)
    with h5py.File(folder / "train_adaptive.h5", "a") as handle:
        handle["pos_boxes"][2, 0] = handle["pos_boxes"][1, 1] - 1
    (folder / "bad.yaml").write_text(yaml.safe_dump(_bottom_up_config(folder)))
    assert main(["train", "--config", str(folder / "bad.yaml"), "--out", str(folder / "o2")]) == 2
    error = capsys.readouterr().err
    assert "train_adaptive.h5: pos_boxes row 2 (image id 13) is" in error
    assert "overlaps or precedes row 1" in error
    # predict --images reads the polyfuse layout only, and says so for a bottom-up file
    questions = folder / "new.json"
    questions.write_text(json.dumps({"questions": [{"question_id": 1, "image_id": 16, "question": "is the shape red?"}]}))
    best = folder / "adaptive" / "checkpoints" / "best.safetensors"
    assert main(["predict", "--checkpoint", str(best), "--data", str(questions), "--images",
                 str(folder / "test_adaptive.h5"), "--out", str(folder / "new.csv")]) == 2  # fmt: skip
    assert "test_adaptive.h5 is a bottom-up features file of ban-vqa" in capsys.readouterr().err
