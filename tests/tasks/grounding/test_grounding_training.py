"""A tiny grounding run on the synthetic release learns: its test Recall@1 is well above
the chance of picking one of the image's boxes at random, and its predictions name the
phrases of the test captions."""

from __future__ import annotations

import json

import pytest
import torch
from tests.tiny.grounding import grounding_config

from polyfuse.engine.config import resolve_config
from polyfuse.engine.run import predict, train
from polyfuse.tasks.grounding.data import build_grounding_data


def test_a_tiny_run_beats_chance_recall_at_one(tmp_path):
    config = grounding_config(tmp_path, images=40)
    config["trainer"]["accelerator"] = "cpu"
    result = train(config, run_dir=tmp_path / "run")
    split = build_grounding_data(resolve_config(config), splits=["test"]).splits["test"]
    batch = split.batch(torch.arange(len(split)))
    real = batch["image"].abs().sum(dim=-1) != 0  # (B, O)
    per_phrase = batch["targets"].sum(dim=-1) / real.sum(dim=-1, keepdim=True)  # chance of a random top box
    chance = per_phrase[batch["phrase_mask"]].mean().item()
    assert chance < 0.2
    assert result.test["R@1"] > max(3 * chance, 0.5), (result.test, chance)
    assert result.test["R@1"] <= result.test["R@5"] <= result.test["R@10"] <= result.test["upper_bound"] <= 1.0
    out = tmp_path / "predictions.json"
    records = predict(result.best_checkpoint, split="test", out=out, top_k=3)
    assert json.loads(out.read_text()) == records
    assert len(records) == int(batch["phrase_mask"].sum())
    first = records[0]
    item = split.items[0]
    assert (first["image_id"], first["caption"], first["phrase"]) == (item.image_id, item.caption, item.phrases[0].text)
    assert len(first["boxes"]) == len(first["scores"]) == len(first["hits"]) == 3
    assert first["scores"] == sorted(first["scores"], reverse=True)
    assert sum(r["hits"][0] for r in records) / len(records) == pytest.approx(result.test["R@1"])
