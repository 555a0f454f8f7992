"""Using a trained VQA model (issue 28): answers to new questions about new images,
predicting the test split without the training files, and the messages of
``extract images`` and ``train`` a user meets on the way.

The network is a stand-in for EfficientNet-Lite0 with its interface (each 32 px cell's
mean colour through a fixed random map to 1,280 values), so that extraction is fast;
the real network is tested in tests/extract/test_extract_images.py."""

from __future__ import annotations

import io
import json
import shutil
import struct
import warnings

import h5py
import numpy as np
import pytest
from PIL import Image
from tests.helpers.runs import best_epoch_of_log, csv_rows
from tests.tiny.vqa import write_vqa_folder
from tests.tiny.vqa_images import PooledColours, picture

import polyfuse.extract.images as extraction
from polyfuse.cli.main import EXIT_INPUT, main


def test_predict_answers_new_questions_about_a_folder_of_new_images(trained_vqa, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(extraction, "load_backbone", PooledColours)
    # The test images again under new ids 100 + i, a file not named by an id, an undecodable image.
    new = tmp_path / "new"
    new.mkdir()
    for image_id in range(16, 20):
        shutil.copy(trained_vqa.folder / "test_images" / f"{image_id}.png", new / f"{100 + image_id}.png")
    shutil.copy(new / "116.png", new / "holiday.png")
    (new / "7.png").write_bytes(b"not an image")
    questions = [{"question_id": 5000 + k, "image_id": 100 + int(row["image_id"]), "question": row["question"]}
                 for k, row in enumerate(trained_vqa.test)]  # fmt: skip
    asked = tmp_path / "questions.json"
    asked.write_text(json.dumps({"questions": [*questions, {"question_id": 1, "image_id": 7, "question": "is it red?"}]}))
    capsys.readouterr()
    out = tmp_path / "answers.csv"
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images", str(new),
                 "--out", str(out)]) == 0  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("polyfuse predict: warning: ") for line in err), err
    assert any("holiday.png" in line and "1 file(s)" in line for line in err), err
    assert any(f"skipping {new / '7.png'}: cannot decode" in line for line in err), err
    assert any("1 question(s) not answered" in line and "7.png" in line for line in err), err
    records = csv_rows(out)
    # oracle: the run's own answers for the test split, read from the file extract images
    # wrote at the run's 64 px (a folder extracted at the default 224 px would differ)
    expected = {(int(r["image_id"]) + 100, r["question"]): r for r in trained_vqa.test}
    assert [int(r["question_id"]) for r in records] == [q["question_id"] for q in questions]
    for record in records:
        same = expected[(int(record["image_id"]), record["question"])]
        assert record["answer"] == same["answer"] and float(record["score"]) == pytest.approx(float(same["score"]), abs=2e-6)
        assert (record["split"], record["accuracy"], record["type"]) == ("new", "", "")

    # A features file works alike; one of another image size, or without an image asked about, is refused.
    for size in (64, 32):
        assert main(["extract", "images", str(new), "--out", str(tmp_path / f"{size}.h5"), "--image-size", str(size),
                     "--no-progress"]) == 0  # fmt: skip
    asked.write_text(json.dumps({"questions": questions}))
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images", str(tmp_path / "64.h5"),
                 "--out", str(tmp_path / "from_file.csv")]) == 0  # fmt: skip
    assert [(r["answer"], r["score"]) for r in csv_rows(tmp_path / "from_file.csv")] == [(r["answer"], r["score"]) for r in records]
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images", str(tmp_path / "32.h5"),
                 "--out", str(tmp_path / "x.csv")]) == EXIT_INPUT  # fmt: skip
    err = capsys.readouterr().err
    assert "efficientnet-lite0 at 32 px" in err and "trained on efficientnet-lite0 at 64 px" in err
    assert "--image-size 64" in err
    asked.write_text(json.dumps({"questions": [*questions, {"question_id": 2, "image_id": 9, "question": "is it red?"}]}))
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images", str(new),
                 "--out", str(tmp_path / "x.csv")]) == EXIT_INPUT  # fmt: skip
    assert f"{new}: no image for image id(s) [9]" in capsys.readouterr().err
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--out", str(tmp_path / "x.csv")]) == EXIT_INPUT
    assert "--data QUESTIONS.json and --images" in capsys.readouterr().err


def test_predict_and_evaluate_on_the_test_split_read_no_training_file(trained_vqa, tmp_path):
    folder = trained_vqa.folder
    scores = tmp_path / "with.json"
    assert main(["evaluate", "--checkpoint", str(trained_vqa.best), "--split", "test", "--out", str(scores)]) == 0
    training = ["train.h5", "train_questions.json", "train_annotations.json"]
    for name in training:
        (folder / name).rename(tmp_path / name)
    try:
        out = tmp_path / "test.csv"
        assert main(["predict", "--checkpoint", str(trained_vqa.best), "--split", "test", "--out", str(out)]) == 0
        assert csv_rows(out) == trained_vqa.test
        assert main(["evaluate", "--checkpoint", str(trained_vqa.best), "--split", "test", "--out", str(tmp_path / "without.json")]) == 0
        assert json.loads((tmp_path / "without.json").read_text()) == json.loads(scores.read_text())
        # new images too: the checkpoint records how its features were made
        assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(folder / "test_questions.json"),
                     "--images", str(folder / "test.h5"), "--out", str(tmp_path / "new.csv")]) == 0  # fmt: skip
        assert [r["answer"] for r in csv_rows(tmp_path / "new.csv")] == [r["answer"] for r in trained_vqa.test]
    finally:
        for name in training:
            (tmp_path / name).rename(folder / name)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_extracting_into_a_file_of_another_image_size_names_both_sizes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(extraction, "load_backbone", PooledColours)
    images = tmp_path / "images"
    images.mkdir()
    for image_id in (0, 1):
        picture(images / f"{image_id}.png", image_id)
    out = tmp_path / "features.h5"
    assert main(["extract", "images", str(images), "--out", str(out), "--image-size", "64", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["extract", "images", str(images), "--out", str(out), "--image-size", "32", "--no-progress"]) == EXIT_INPUT
    line = _error_line(capsys)
    assert f"{out} holds features of 2 x 2 cells (64 px images)" in line
    assert "--image-size 32 gives 1 x 1 cells (32 px images)" in line and "use --image-size 64" in line
    with h5py.File(out) as handle:  # untouched
        assert sorted(handle["image_ids"][:].tolist()) == [0, 1] and handle.attrs["image_size"] == 64


def test_feature_settings_of_files_with_and_without_the_record(tmp_path):
    """What a run records of its features: files of extract images from before the
    attributes are recognised (1280-d square grid and sha256); others are not ours."""
    old = tmp_path / "old.h5"
    with h5py.File(old, "w") as handle:
        handle["features"] = np.zeros((2, 9, 1280), dtype=np.float16)
        handle["sha256"] = np.array([b"0" * 64] * 2)
    assert extraction.feature_settings(old) == {"objects": 9, "feature_size": 1280, "extractor": "efficientnet-lite0", "image_size": 96}
    with h5py.File(old, "a") as handle:
        del handle["sha256"]  # a user's own 1280-d features
    assert extraction.feature_settings(old) == {"objects": 9, "feature_size": 1280, "extractor": None, "image_size": None}
    regions = tmp_path / "regions.h5"
    with h5py.File(regions, "w") as handle:  # bottom-up, adaptive layout: no fixed object axis
        handle["image_features"] = np.zeros((11, 2048), dtype=np.float32)
    assert extraction.feature_settings(regions) == {"objects": None, "feature_size": 2048, "extractor": None, "image_size": None}


def test_a_file_not_named_by_an_image_id_is_skipped_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(extraction, "load_backbone", PooledColours)
    images = tmp_path / "images"
    images.mkdir()
    for name, image_id in (("0.png", 0), ("1.png", 1), ("cat.png", 2), ("photo 2.jpg", 3)):
        picture(images / name, image_id)
    (images / "notes.txt").write_text("not an image, not counted")
    out = tmp_path / "features.h5"
    assert main(["extract", "images", str(images), "--out", str(out), "--image-size", "32", "--no-progress"]) == 0
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("polyfuse extract: warning: skipping 2 file(s)")
    assert "cat.png, photo 2.jpg" in line and "<integer id>.<ext>" in line and "notes.txt" not in line
    assert "2 images computed" in captured.out
    with h5py.File(out) as handle:
        assert sorted(handle["image_ids"][:].tolist()) == [0, 1]
    for name in ("0.png", "1.png"):
        (images / name).unlink()
    assert main(["extract", "images", str(images), "--out", str(tmp_path / "none.h5")]) == EXIT_INPUT
    line = _error_line(capsys)
    assert f"{images}: no usable image" in line and "cat.png, photo 2.jpg" in line


def _with_broken_exif(source, path) -> None:
    """``source`` as a JPEG whose EXIF block points past its end (PIL warns "Corrupt EXIF data")."""
    buffer = io.BytesIO()
    Image.open(source).convert("RGB").save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    # one IFD entry (Make, ASCII, 32 bytes) whose data lies at offset 128, past the block
    exif = b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08\x00\x05" + b"\x01\x0f\x00\x02\x00\x00\x00\x20\x00\x00\x00\x80"
    path.write_bytes(jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif + jpeg[2:])


def test_decoder_warnings_name_the_file_and_never_leak(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(extraction, "load_backbone", PooledColours)
    images = tmp_path / "images"
    images.mkdir()
    picture(images / "0.png", 0)
    _with_broken_exif(images / "0.png", images / "1.jpg")
    palette = Image.open(images / "0.png").convert("P")
    palette.save(images / "2.png", transparency=bytes([0] * 8))  # PIL: "Palette images with Transparency ..."
    (images / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage")
    out = tmp_path / "features.h5"
    assert main(["extract", "images", str(images), "--out", str(out), "--image-size", "32", "--no-progress"]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 2, err  # one line per image the decoder complained about, none for 0.png and 2.png
    assert err[0].startswith(f"polyfuse extract: warning: {images / '1.jpg'}: decoded and kept, but the decoder warned: ")
    assert "EXIF" in err[0]
    assert err[1].startswith(f"polyfuse extract: warning: skipping {images / '3.png'}: cannot decode the image")
    assert "3 images computed, 0 cached, 1 skipped" in captured.out
    assert f"kept, the decoder warned: {images / '1.jpg'}" in captured.out
    with h5py.File(out) as handle:
        assert sorted(handle["image_ids"][:].tolist()) == [0, 1, 2]
    # the library alone: every warning names its file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extraction.extract_image_features(extraction.image_ids_of_folder(images), tmp_path / "again.h5",
                                          image_size=32, progress=False, backbone=PooledColours())  # fmt: skip
    assert sorted(str(w.message).split(":")[0].removeprefix("skipping ") for w in caught) == [
        str(images / "1.jpg"), str(images / "3.png")
    ]


def test_train_reports_the_best_epoch_and_the_epochs_trained(tmp_path, capsys):
    folder = write_vqa_folder(tmp_path, 8, 4)
    run = tmp_path / "run"
    # the highest validation loss is kept: an early epoch, while training goes on
    assert main(["train", "--config", str(folder / "vqa.yaml"), "--max-epochs", "4", "--out", str(run),
                 "--set", "trainer.monitor=val/loss", "--set", "trainer.mode=max"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    best = best_epoch_of_log(run, "val/loss", "max", 4)  # oracle: the run's own CSV log
    assert best < 4  # the message is tested where best and trained differ
    assert f"best checkpoint: {run / 'checkpoints' / 'best.safetensors'} (epoch {best} of 4 trained, " in printed
    results = json.loads((run / "results.json").read_text())
    assert (results["best_epoch"], results["epochs"]) == (best, 4)
