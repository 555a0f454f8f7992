"""Tests for polyfuse.bench.maf: the Eq. 19 attention entropy of trained captioning runs.

References: the entropy of fixed distributions by hand; for two tiny runs trained by
``polyfuse compare`` with the shipped ``maf_literal`` / ``maf_log`` variants, the
entropy recomputed here video by video (one video per batch, so no padding), from
the attention the decoder records when its own greedy caption is fed back to it
(teacher forcing, as the captioning figure reads it), with numpy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from polyfuse.bench import maf as bench_maf
from polyfuse.cli.main import main

VARIANTS = Path(__file__).resolve().parents[2] / "configs" / "msvd" / "variants"
WORDS = ["dog", "cat", "car", "man"]


def test_attention_entropy_by_hand():
    attention = torch.tensor([[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    got = bench_maf.attention_entropy(attention)
    assert abs(float(got[0]) - expected) < 1e-12 and float(got[1]) == 0.0
    uniform = torch.full((1, 20), 1 / 20, dtype=torch.float64)
    assert abs(float(bench_maf.attention_entropy(uniform)[0]) - math.log(20)) < 1e-12


def _write_folder(folder: Path) -> Path:
    """12 videos, 4 kinds; appearance of 3 to 5 steps (the test videos differ, so a batch
    of them is padded), one step of it carrying the kind; motion of 4 steps of noise."""
    rng = np.random.default_rng(0)
    ids = [f"vid{i:02d}" for i in range(12)]
    kind = {v: i % len(WORDS) for i, v in enumerate(ids)}
    appearance = {}
    for i, video in enumerate(ids):
        steps = rng.normal(size=(3 + i % 3, 6))
        steps[i % 2] += 3 * (kind[video] + 1)
        appearance[video] = steps.astype(np.float32)
    np.savez(folder / "appearance.npz", **appearance)
    np.savez(folder / "motion.npz", video_ids=np.array(ids), flow=rng.normal(size=(12, 4, 3)).astype(np.float16))
    captions = {v: [f"a {WORDS[kind[v]]} is here", f"the {WORDS[kind[v]]} moves"] for v in ids}
    (folder / "captions.json").write_text(json.dumps(captions))
    (folder / "splits.json").write_text(json.dumps({"train": ids[:8], "val": ids[8:10], "test": ids[10:]}))
    config = {
        "name": "maf",
        "task": {"type": "captioning"},
        "data": {"batch_size": 8, "eval_batch_size": 4},
        "captioning": {"features": {"appearance": "appearance.npz", "motion": "motion.npz#flow"},
                       "captions": "captions.json", "splits": "splits.json", "min_count": 1,
                       "beam_size": 2, "max_length": 6, "meteor": False},
        "decoder": {"variant": "HOCA-UB", "feature_dim": 8, "embed_dim": 8, "hidden_dim": 12,
                    "attention_dim": 4, "dropout": 0.0},
        "optim": {"lr": 0.03},
        "trainer": {"max_epochs": 15, "patience": 0, "accelerator": "cpu", "progress_bar": False,
                    "quiet": True, "num_threads": 1},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _entropy_by_video(checkpoint: Path) -> dict[str, tuple[float, float]]:
    """Per modality: (mean entropy in nats, mean of entropy / log T) over every word of the
    greedy captions of the test videos, each video decoded alone."""
    from polyfuse.engine import load_model
    from polyfuse.nn.beam_search import score_captions
    from polyfuse.tasks.captioning.spec import checkpoint_captioning_data

    task, extras = load_model(checkpoint)
    data = checkpoint_captioning_data(extras)
    vocabulary = task.vocabulary
    per_word: list[list[tuple[float, float]]] = [[] for _ in data.modalities]
    with torch.no_grad():
        for video in data.splits["test"]:
            inputs, masks = data.gather(torch.tensor([data.row_of(video)]))
            assert all(bool(mask.all()) for mask in masks)  # one video: every step is real
            encoded = task.model.encode(inputs, masks)
            tokens, _ = task.model.decoder.greedy(
                encoded, masks, begin_index=vocabulary.begin, end_index=vocabulary.end,
                max_length=task.max_length, banned_tokens=task.banned_tokens)
            words = [int(t) for t in tokens[0] if int(t) != vocabulary.pad]
            _, steps = score_captions(task.model.decoder, encoded, masks, torch.tensor([words]),
                                      begin_index=vocabulary.begin, end_index=vocabulary.end)
            for m in range(len(masks)):
                for step in steps[: len(words)]:
                    p = step.attention[m][0].double().numpy()
                    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)
                    nats = -sum(float(x * np.log(x)) for x in p if x > 0)
                    per_word[m].append((nats, nats / np.log(len(p))))
    return {name: tuple(float(np.mean(column)) for column in zip(*per_word[m], strict=True))
            for m, name in enumerate(data.modalities)}


def test_bench_on_two_trained_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _write_folder(tmp_path)
    out = tmp_path / "compare"
    models = f"{VARIANTS / 'maf_literal.yaml'},{VARIANTS / 'maf_log.yaml'}"
    assert main(["compare", "--config", str(config), "--models", models, "--seeds", "1", "--out", str(out),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["bench", "maf", str(out), "--output-dir", str(tmp_path / "bench"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    payload = json.loads((tmp_path / "bench" / "maf.json").read_text())
    table = (tmp_path / "bench" / "maf.md").read_text()
    assert payload["table"] == table and table in printed
    rows = {row["label"]: row for row in payload["rows"]}
    assert sorted(rows) == ["maf_literal/seed0", "maf_log/seed0"]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    for label, form in (("maf_literal/seed0", "literal"), ("maf_log/seed0", "log")):
        row = rows[label]
        assert row["combination"] == form and row["seed"] == 0 and row["videos"] == 2
        expected = _entropy_by_video(Path(row["checkpoint"]))
        cells = lines[label].split(" | ")
        assert cells[1] == form
        for column, name in enumerate(("appearance", "motion"), start=3):
            nats, relative = expected[name]
            assert row["modalities"][name]["nats"] == pytest.approx(nats, abs=1e-5)
            assert row["modalities"][name]["relative"] == pytest.approx(relative, abs=1e-5)
            assert cells[column] == f"{nats:.3f} ({relative:.3f})"
        # the caption metrics are the run's own, not recomputed
        results = json.loads((out / label / "results.json").read_text())
        assert row["test"]["CIDEr-D"] == results["test"]["CIDEr-D"] and row["test"]["METEOR"] is None
        assert cells[-1].rstrip(" |") == f"{results['test']['loss']:.3f}"
    # Trained, the attention is not uniform: the test above can tell entropies apart.
    relatives = [rows[label]["modalities"]["appearance"]["relative"] for label in rows]
    assert min(relatives) < 0.9
    # A run directory is read as well as a compare output, with the same numbers.
    assert main(["bench", "maf", str(out / "maf_log" / "seed0"), "--output-dir", str(tmp_path / "one"),
                 "--quiet"]) == 0
    single = json.loads((tmp_path / "one" / "maf.json").read_text())["rows"]
    assert single[0]["label"] == "seed0" and single[0]["modalities"] == rows["maf_log/seed0"]["modalities"]


def test_a_path_without_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "maf", str(tmp_path), "--output-dir", str(tmp_path / "bench")]) == 2
    assert "is neither a run directory" in capsys.readouterr().err
    assert not (tmp_path / "bench" / "maf.json").exists()


def test_mean_and_std_rows_by_hand() -> None:
    def row(form: str, seed: int, nats: float, relative: float, cider: float) -> dict:
        return {"label": f"{form}/seed{seed}", "combination": form, "seed": seed,
                "modalities": {"vgg": {"nats": nats, "relative": relative}},
                "test": {"BLEU-4": 0.2, "METEOR": None, "ROUGE-L": 0.5, "CIDEr-D": cider, "loss": 4.0}}

    rows = [row("log", 0, 1.0, 0.5, 0.30), row("literal", 0, 2.9, 0.99, 0.25), row("log", 1, 2.0, 0.7, 0.40)]
    summary = bench_maf.summarise_forms(rows)
    assert list(summary) == ["log"]  # one literal run: no spread to report
    log = summary["log"]
    assert log["runs"] == 2 and log["nats vgg"]["mean"] == pytest.approx(1.5)
    assert log["nats vgg"]["std"] == pytest.approx(math.sqrt(0.5))  # sample std of 1 and 2
    assert log["CIDEr-D"]["std"] == pytest.approx(math.sqrt(0.005))
    assert log["METEOR"] == {"mean": None, "std": None}
    lines = bench_maf.maf_table(rows).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| log/seed0", "| log/seed1", "| literal/seed0",
                                                            "| mean ± std (2 runs)"]
    assert lines[-1] == ("| mean ± std (2 runs) | log |  | 1.500 ± 0.707 (0.600) | 20.0 ± 0.0 | n/a | 50.0 ± 0.0 "
                         "| 35.0 ± 7.1 | 4.000 ± 0.000 |")
