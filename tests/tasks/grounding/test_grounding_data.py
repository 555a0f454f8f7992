"""Grounding data: the generated release files parse as the release's, phrases get their
last word and ground truth, targets are the boxes at IoU >= 0.5 (checked against a hand
computation), boxes come back in pixels, and bad input is one error naming where."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

import h5py
import numpy as np
import pytest
import torch
from tests.tiny.grounding import grounding_config

from polyfuse.data.synthetic_flickr30k import write_flickr30k_like
from polyfuse.engine.config import resolve_config
from polyfuse.metrics.grounding import box_targets
from polyfuse.tasks.grounding.data import build_grounding_data, read_image_ids, read_items


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_flickr30k_like(tmp_path_factory.mktemp("flickr") / "f30k", images=10, seed=3, feature_dim=8)


def test_the_generated_files_have_the_release_layout(release):
    ids = {split: read_image_ids(release.folder / f"{split}.txt") for split in ("train", "val", "test")}
    assert ids == release.splits and sum(map(len, ids.values())) == 10
    assert not set(ids["train"]) & set(ids["test"]) and not set(ids["val"]) & set(ids["test"])
    image = ids["train"][0]
    root = ElementTree.parse(release.folder / "Annotations" / f"{image}.xml").getroot()
    assert root.tag == "annotation" and root.findtext("filename") == f"{image}.jpg"
    assert root.find("size").findtext("depth") == "3" and int(root.find("size").findtext("width")) >= 300
    objects = root.findall("object")
    assert any(o.find("nobndbox") is not None for o in objects)
    assert all(o.find("bndbox").findtext(t).isdigit() for o in objects if o.find("bndbox") is not None
               for t in ("xmin", "ymin", "xmax", "ymax"))
    lines = (release.folder / "Sentences" / f"{image}.txt").read_text().splitlines()
    assert len(lines) == 5 and all(re.search(r"\[/EN#\d+/people|\[/EN#\d+/\w+ ", line) for line in lines)


def test_items_keep_phrases_with_boxes_at_their_last_word(release):
    image = release.splits["train"][0]
    items = read_items(release.folder, [image], max_length=82)
    assert [item.caption for item in items] == [0, 1, 2, 3, 4]
    root = ElementTree.parse(release.folder / "Annotations" / f"{image}.xml").getroot()
    boxed = {}
    for o in root.findall("object"):
        if o.find("bndbox") is not None:
            boxed.setdefault(int(o.findtext("name")), []).append(
                tuple(float(o.find("bndbox").findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax")))
    line = (release.folder / "Sentences" / f"{image}.txt").read_text().splitlines()[0]
    marked = re.findall(r"\[/EN#(\d+)/(\w+) ([^\]]+)\]", line)
    assert len(marked) == 3  # two objects and the scene, which has no box
    item = items[0]
    assert [p.entity_id for p in item.phrases] == [int(e) for e, kind, _ in marked if kind != "scene"]
    for phrase in item.phrases:
        assert item.words[phrase.position] == phrase.text.split()[-1]  # the phrase's last word
        assert " ".join(item.words[phrase.position - len(phrase.text.split()) + 1 : phrase.position + 1]) == phrase.text
        assert list(phrase.truth) == boxed[phrase.entity_id]
    # a phrase ending beyond max_length is skipped
    short = read_items(release.folder, [image], max_length=item.phrases[1].position)
    assert all(p.position < item.phrases[1].position for i in short for p in i.phrases)


def _hand_iou(a, b):
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_box_targets_are_the_boxes_at_iou_one_half_by_hand():
    truth = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 0.0, 30.0, 10.0]])
    boxes = torch.tensor([[0.0, 0.0, 10.0, 5.0],  # IoU 0.5 with the first: in
                          [0.0, 0.0, 10.0, 4.9],  # 0.49: out
                          [21.0, 1.0, 30.0, 10.0],  # 0.81 with the second: in
                          [0.0, 0.0, 30.0, 10.0],  # 1/3 with each, 2/3 with their union
                          [0.0, 0.0, 0.0, 0.0]])  # padding
    hand = [max(_hand_iou(b, t) for t in truth.tolist()) >= 0.5 for b in boxes.tolist()]
    assert hand == [True, False, True, False, False]
    assert box_targets(boxes, truth).tolist() == hand
    assert box_targets(boxes, truth, merge="union").tolist() == [False, False, False, True, False]


def test_batches_hold_pixel_boxes_and_the_iou_targets(tmp_path):
    config = resolve_config(grounding_config(tmp_path, images=6))
    data = build_grounding_data(config, splits=["train"])
    split = data.splits["train"]
    batch = split.batch(torch.arange(len(split)))
    section = config["data"]["grounding"]
    with h5py.File(section["features"]) as handle:  # ban-vqa's pixel boxes image_bb
        pixels, spans = handle["image_bb"][:], handle["pos_boxes"][:]
    for b, item in enumerate(split.items):
        start, end = spans[split.features.rows[item.image_id]]
        np.testing.assert_allclose(batch["boxes"][b, : end - start].numpy(), pixels[start:end], atol=1e-2)
        assert not batch["boxes"][b, end - start :].any()
        for p, phrase in enumerate(item.phrases):
            hand = [max(_hand_iou(box, t) for t in phrase.truth) >= 0.5 for box in pixels[start:end].tolist()]
            assert batch["targets"][b, p, : end - start].bool().tolist() == hand
            assert batch["positions"][b, p] == phrase.position and batch["phrase_mask"][b, p]
        assert not batch["phrase_mask"][b, len(item.phrases) :].any()
    assert batch["targets"].sum() > 0


def _write(path, text):
    path.write_text(text)


def test_bad_input_is_one_error_naming_where(tmp_path):
    config = grounding_config(tmp_path, images=6)
    folder = tmp_path / "flickr30k"
    image = read_image_ids(folder / "train.txt")[0]
    sentences = folder / "Sentences" / f"{image}.txt"
    good = sentences.read_text()
    lines = good.splitlines()
    _write(sentences, "\n".join([lines[0], "A [/EN#5/people man walks ."]) + "\n")
    with pytest.raises(ValueError, match=rf"{image}\.txt line 2: malformed phrase markup"):
        build_grounding_data(resolve_config(config))
    _write(sentences, good)
    annotation = folder / "Annotations" / f"{image}.xml"
    xml = annotation.read_text()
    annotation.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{image}\.xml does not exist"):
        build_grounding_data(resolve_config(config))
    _write(annotation, re.sub(r"<xmin>\d+</xmin>", "<xmin>nan</xmin>", xml, count=1))
    with pytest.raises(ValueError, match=rf"{image}\.xml: entity \d+ has a box with NaN"):
        build_grounding_data(resolve_config(config))
    _write(annotation, xml)
    (folder / "train.txt").write_text((folder / "train.txt").read_text() + "123\n")
    _write(folder / "Sentences" / "123.txt", good)
    _write(folder / "Annotations" / "123.xml", xml)
    with pytest.raises(ValueError, match=r"no features for image id\(s\) \[123\]"):
        build_grounding_data(resolve_config(config))


def test_nan_features_are_refused_naming_the_image(tmp_path):
    config = grounding_config(tmp_path, images=6)
    features = config["data"]["grounding"]["features"]
    with h5py.File(features, "r+") as handle:
        handle["image_features"][0, 0] = np.nan
        first = int(handle["image_ids"][0])
    with pytest.raises(ValueError, match=rf"NaN or Inf .* image id {first}"):
        build_grounding_data(resolve_config(config))


def test_the_synthetic_command_writes_a_set_the_task_reads(tmp_path, capsys):
    from polyfuse.cli.main import main

    out = tmp_path / "set"
    assert main(["grounding", "synthetic", str(out), "--images", "5", "--feature-dim", "4", "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "3 train images, 1 val images, 1 test images" in printed and f"features_index: {out}" in printed
    config = grounding_config(tmp_path / "other", images=3)
    config["data"]["grounding"] = {"entities": str(out), "features": str(out / "features.hdf5"),
                                   "features_index": str(out / "features_imgid2idx.json")}
    data = build_grounding_data(resolve_config(config))
    assert data.image_dim == 4 and sum(len(split) for split in data.splits.values()) == 25
