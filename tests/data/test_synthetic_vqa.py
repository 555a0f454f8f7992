"""The synthetic VQA 2.0-shaped set: the official formats, the TSV and HDF5 agreeing,
determinism, and answers that the region features carry."""

from __future__ import annotations

import base64
import json
from collections import Counter

import numpy as np
import pytest

from polyfuse.cli.main import main
from polyfuse.data.formats.features import load_bottom_up_features
from polyfuse.data.formats.vqa import load_vqa
from polyfuse.data.synthetic_vqa import OBJECTS, write_vqa2_like

SIZES = {
    "images": 40,
    "feature_dim": 24,
    "min_boxes": 10,
    "max_boxes": 20,
    "questions_per_image": 4,
}


@pytest.fixture(scope="module")
def vqa2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vqa2")
    return folder, write_vqa2_like(folder, seed=3, **SIZES)


def _decode_tsv(path) -> dict[int, tuple[int, int, np.ndarray, np.ndarray]]:
    images = {}
    for line in path.read_text().splitlines():
        image_id, w, h, n, boxes, features = line.split("\t")
        n = int(n)
        images[int(image_id)] = (
            int(w),
            int(h),
            np.frombuffer(base64.b64decode(boxes), dtype="<f4").reshape(n, 4),
            np.frombuffer(base64.b64decode(features), dtype="<f4").reshape(n, -1),
        )
    return images


def test_the_official_json_formats(vqa2):
    folder, paths = vqa2
    assert sorted(paths) == ["train", "val"]
    for split in ("train", "val"):
        assert (
            paths[split]["questions"] == folder / f"v2_OpenEnded_mscoco_{split}2014_questions.json"
        )
        assert paths[split]["annotations"] == folder / f"v2_mscoco_{split}2014_annotations.json"
        questions = json.loads(paths[split]["questions"].read_text())
        annotations = json.loads(paths[split]["annotations"].read_text())
        assert questions["task_type"] == "Open-Ended" and questions["data_type"] == "mscoco"
        assert questions["data_subtype"] == annotations["data_subtype"] == f"{split}2014"
        assert {"info", "license"} <= set(questions) and {"info", "license"} <= set(annotations)
        assert len(questions["questions"]) == SIZES["images"] * SIZES["questions_per_image"]
        assert set(questions["questions"][0]) == {"image_id", "question", "question_id"}
        for entry in annotations["annotations"]:
            assert set(entry) == {"question_type", "multiple_choice_answer", "answers", "image_id",
                                  "answer_type", "question_id"}  # fmt: skip
            assert entry["answer_type"] in {"yes/no", "number", "other"}
            assert [a["answer_id"] for a in entry["answers"]] == list(range(1, 11))
            assert {a["answer_confidence"] for a in entry["answers"]} <= {"yes", "maybe", "no"}
            texts = Counter(a["answer"] for a in entry["answers"])
            assert texts[entry["multiple_choice_answer"]] == max(texts.values())
            assert entry["question_id"] // 1000 == entry["image_id"]
        loaded = load_vqa(paths[split]["questions"], paths[split]["annotations"])
        assert len(loaded) == len(questions["questions"])
        assert all(len(q.answers) == 10 for q in loaded)
    train_ids = {
        q.image_id for q in load_vqa(paths["train"]["questions"], paths["train"]["annotations"])
    }
    val_ids = {q.image_id for q in load_vqa(paths["val"]["questions"], paths["val"]["annotations"])}
    assert not train_ids & val_ids and len(train_ids) == SIZES["images"]
    assert max(train_ids | val_ids) > 1000  # COCO-like ids


def test_hdf5_holds_the_numbers_of_the_tsv(vqa2):
    _, paths = vqa2
    for split in ("train", "val"):
        decoded = _decode_tsv(paths[split]["tsv"])
        assert len(decoded) == SIZES["images"]
        counts = [len(v[2]) for v in decoded.values()]
        assert min(counts) >= SIZES["min_boxes"] and max(counts) <= SIZES["max_boxes"]
        assert len(set(counts)) > 1
        loaded = load_bottom_up_features(paths[split]["hdf5"], paths[split]["index"])
        assert json.loads(paths[split]["index"].read_text()).keys() == {str(i) for i in decoded}
        for image_id, (w, h, boxes, features) in decoded.items():
            row, n = loaded.rows[image_id], len(boxes)
            assert w >= 1 and h >= 1 and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
            np.testing.assert_array_equal(loaded.features[row, :n].numpy(), features)
            np.testing.assert_allclose(
                loaded.boxes[row, :n].numpy(), boxes / [w, h, w, h], rtol=1e-6
            )
            assert (loaded.features[row, n:] == 0).all()


def test_the_same_seed_gives_the_same_files_whatever_the_formats(vqa2, tmp_path):
    _, paths = vqa2
    again = write_vqa2_like(tmp_path / "a", seed=3, formats=("hdf5",), **SIZES)
    assert "tsv" not in again["train"] and not (tmp_path / "a" / "train.tsv").exists()
    for name in ("questions", "annotations", "index"):
        assert again["val"][name].read_bytes() == paths["val"][name].read_bytes()
    a = load_bottom_up_features(again["val"]["hdf5"], again["val"]["index"])
    b = load_bottom_up_features(paths["val"]["hdf5"], paths["val"]["index"])
    assert a.rows == b.rows and bool((a.features == b.features).all())
    other = write_vqa2_like(tmp_path / "b", seed=4, formats=("tsv",), **SIZES)
    assert other["train"]["tsv"].read_bytes() != paths["train"]["tsv"].read_bytes()
    with pytest.raises(ValueError, match="formats"):
        write_vqa2_like(tmp_path / "c", images=2, formats=("npz",))


def _presence(questions) -> dict[tuple[int, str], bool]:
    """Whether each image holds each object, from the yes/no and number answers."""
    known = {}
    for q in questions:
        for name in OBJECTS:
            if q.question == f"Is there a {name} in the picture?":
                known[q.image_id, name] = q.multiple_choice_answer == "yes"
            elif q.question == f"How many {name}s are there?":
                known[q.image_id, name] = q.multiple_choice_answer != "0"
    return known


def _best_box(features: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """The largest projection on ``direction`` of the real boxes of each image (padding is 0)."""
    real = np.abs(features).sum(-1) > 0
    return np.where(real, features @ direction, -np.inf).max(-1)


def test_answers_are_learnable_from_the_regions(tmp_path):
    """A probe per object fitted on train (the mean difference of the box-averaged features
    of images with and without it; an image holds it when its best box projects above a
    cut) answers val's yes/no and how-many-nonzero well above the answer prior."""
    paths = write_vqa2_like(
        tmp_path, images=150, feature_dim=64, min_boxes=4, max_boxes=8, formats=("hdf5",)
    )
    data = {}
    for split in ("train", "val"):
        loaded = load_bottom_up_features(paths[split]["hdf5"], paths[split]["index"])
        features = loaded.features.numpy()
        boxes = (np.abs(features).sum(-1) > 0).sum(1, keepdims=True)
        questions = load_vqa(paths[split]["questions"], paths[split]["annotations"])
        data[split] = (loaded.rows, features, features.sum(1) / boxes, _presence(questions))
    rows, features, mean, known = data["train"]
    probes = {}
    for name in OBJECTS:
        yes = [rows[i] for (i, n), v in known.items() if n == name and v]
        no = [rows[i] for (i, n), v in known.items() if n == name and not v]
        direction = mean[yes].mean(0) - mean[no].mean(0)
        cut = (
            np.median(_best_box(features[yes], direction))
            + np.median(_best_box(features[no], direction))
        ) / 2
        probes[name] = (direction, cut)
    rows, features, _, known = data["val"]
    right = [
        (_best_box(features[rows[i]][None], probes[n][0])[0] > probes[n][1]) == v
        for (i, n), v in known.items()
    ]
    prior = Counter(known.values()).most_common(1)[0][1] / len(known)
    assert len(known) > 200
    assert np.mean(right) > max(0.85, prior + 0.2), (np.mean(right), prior)


def test_cli_synthetic(tmp_path, capsys):
    out = tmp_path / "set"
    args = ["vqa", "synthetic", str(out), "--images", "3", "--feature-dim", "8", "--min-boxes", "2"]
    assert main([*args, "--max-boxes", "4", "--formats", "tsv"]) == 0
    assert "train.tsv" in capsys.readouterr().out
    assert (out / "val.tsv").is_file() and not (out / "val.hdf5").exists()
    assert main([*args, "--max-boxes", "1"]) == 2  # min above max: a one-line input error
    assert "min_boxes 2, max_boxes 1" in capsys.readouterr().err
