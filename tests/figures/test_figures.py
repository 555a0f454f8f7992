"""polyfuse.figures: pure drawing from arrays and dicts; what each figure shows, checked
in the written image where it is cheap, and bad input refused before drawing. (The
attention, caption and learning-curve figures are drawn end to end by tests/cli and
tests/tasks/captioning/test_captioning_engine.py; here only their refusals, as drawing costs.)"""

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.image

from polyfuse.figures import attention, benchmarks, captioning, curves, retrieval, vqa


def _png(path):
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    return image[..., :3]


def test_curve_metrics_put_the_monitor_first_then_three_others():
    keys = ["train/loss", "val/loss", "val/mae", "val/acc", "val/f1", "val/corr", "val/zeta", "epoch"]
    assert curves.curve_metrics(keys, "val/mae") == ["val/mae", "val/acc", "val/corr", "val/f1"]
    assert curves.curve_metrics(keys, None) == ["val/acc", "val/corr", "val/f1"]
    assert curves.curve_metrics(keys, "val/loss") == ["val/acc", "val/corr", "val/f1"]  # the loss has its own panel


def test_ranking_shows_each_frame_in_rank_order_and_marks_correctness(tmp_path):
    class Ranked:
        def __init__(self, rank, video_id, score, correct):
            self.rank, self.video_id, self.score, self.correct = rank, video_id, score, correct

    blue = np.broadcast_to(np.array([0, 0, 255], dtype=np.uint8), (32, 32, 3))
    red = np.broadcast_to(np.array([255, 0, 0], dtype=np.uint8), (32, 32, 3))
    ranking = [Ranked(1, "b", 0.9, True), Ranked(2, "a", 0.5, False)]
    image = _png(retrieval.draw_ranking_frames(ranking, [blue, red], "a query", tmp_path / "top.png"))
    half = image.shape[1] // 2
    left, right = image[:, :half].reshape(-1, 3), image[:, half:].reshape(-1, 3)

    def share(pixels, colour):
        return (np.abs(pixels - np.array(colour)).max(axis=1) < 0.05).mean()

    assert share(left, [0, 0, 1]) > 0.05 and share(right, [1, 0, 0]) > 0.05  # rank 1 (blue) left, rank 2 right
    assert share(left, [1, 0, 0]) == 0 and share(right, [0, 0, 1]) == 0
    assert share(left, [0, 128 / 255, 0]) > 0  # the correct video framed in green ("green" is (0, 0.5, 0))
    assert share(right, [0, 128 / 255, 0]) == 0
    with pytest.raises(ValueError, match="1 frames for 2 ranked videos"):
        retrieval.draw_ranking_frames(ranking, [blue], "q", tmp_path / "x.png")


def test_vqa_attention_refuses_a_grid_or_words_that_do_not_fit(tmp_path):
    maps = np.full((2, 4, 3), 1 / 12)
    with pytest.raises(ValueError, match="grid 3 x 1 does not hold 4 objects"):
        vqa.draw_vqa_attention(maps, ["a", "b", "c"], (3, 1), None, tmp_path / "x.png")
    with pytest.raises(ValueError, match="2 words for attention over 3 positions"):
        vqa.draw_vqa_attention(maps, ["a", "b"], (2, 2), None, tmp_path / "x.png")


def test_vqa_summary_draws_a_bar_per_model_and_type(tmp_path):
    rows = [{"model": "ban", "acc_mean": 0.8, "acc_std": 0.01, "acc/yes/no_mean": 0.9, "acc/yes/no_std": 0.0},
            {"model": "man", "acc_mean": 0.7, "acc_std": 0.02, "acc/yes/no_mean": 0.85, "acc/yes/no_std": 0.01}]
    _png(vqa.draw_vqa_summary(rows, ["yes/no"], tmp_path / "summary.png"))
    with pytest.raises(ValueError, match="no rows"):
        vqa.draw_vqa_summary([], [], tmp_path / "x.png")


def test_attention_maps_refuse_a_layer_without_one_map_per_input(tmp_path):
    layer = [np.full((2, 5), 0.2), np.full((2, 4), 0.25)]
    with pytest.raises(ValueError, match="one map per input"):
        attention.draw_man_attention({"layers": [layer[:1]], "names": ["text", "audio"]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"\(glimpses, T_x, T_y\)"):
        attention.draw_ban_maps({"maps": np.ones((3, 4)), "names": ["x", "y"]}, tmp_path / "x.png")


def test_caption_attention_refuses_maps_that_do_not_match_the_words(tmp_path):
    found = {"video": "v1", "split": "test", "caption": "a cat", "words": ["a", "cat", "<eos>"],
             "attention": [np.full((3, 4), 0.25), np.full((3, 2), 0.5)], "modality_weights": np.full((3, 2), 0.5),
             "modalities": ["rgb", "audio"], "references": ["a cat sits"], "frame_stride": 2}
    with pytest.raises(ValueError, match="audio attention has 2 rows for 3 words"):
        captioning.draw_caption_attention({**found, "attention": [found["attention"][0], np.ones((2, 2))]}, None,
                                          tmp_path / "x.png")


def test_benchmark_figures_write_their_files(tmp_path):
    timing = {"median": 0.01}
    complexity = {"rows": [
        {"sweep": "length", "length": t, "model": model, "status": "ok", "flops": 10 * t, "forward_s": timing,
         "forward_backward_s": timing, "peak_bytes": 1000 * t} for t in (8, 16) for model in ("man-had", "ban")
    ] + [{"sweep": "length", "length": 32, "model": "ban", "status": "not run", "flops": None, "forward_s": None,
          "forward_backward_s": None, "peak_bytes": None}]}
    assert benchmarks.draw_complexity(complexity, tmp_path) == [tmp_path / "complexity_length.png"]
    variants = {name: {"ratio_to_man": {"flops_total": r, "flops_attention": r, "paper_flops": r}}
                for name, r in (("MAN", 1.0), ("w/o HAD", 4.0))}
    paper = {"primary_length": 20, "results": [{"length": 20, "variants": variants}]}
    assert benchmarks.draw_paper(paper, tmp_path) == [tmp_path / "paper_flops.png"]
    approximation = {
        "attention": [{"modalities": 2, "scale": 0.3, "random_features": h, "error_arf": 1 / h, "error_gerf": 0.5 / h}
                      for h in (16, 64)],
        "kernel": [{"norm": 0.5, "random_features": h, "predicted_mse_iid": 1 / h, "measured_mse_iid": 1.1 / h,
                    "measured_mse_orthogonal": 0.9 / h} for h in (16, 64)],
        "choices": [{"choice": "had", "random_features": 16, "forward_backward_ms": 2.0, "output_error": 0.1},
                    {"choice": "exact", "random_features": 0, "forward_backward_ms": 5.0, "output_error": 0.0}],
    }
    assert benchmarks.draw_approximation(approximation, tmp_path) == [
        tmp_path / "approximation_attention_error.png", tmp_path / "approximation_choices.png",
        tmp_path / "approximation_kernel_mse.png"]
    decoder = {"settings": {"modalities": [3, 4], "length": 8, "batch": 2, "hidden_dim": 8, "attention_dim": 8},
               "rows": [{"orders": "T", "modalities": n, "exact_seconds": 0.001 * n, "low_rank_seconds": 0.001,
                         "exact_peak_bytes": 2**20 * n, "low_rank_peak_bytes": 2**20} for n in (3, 4)]}
    assert benchmarks.draw_captioning_bench(decoder, tmp_path) == [tmp_path / "captioning_decoder_step.png"]
    for path in tmp_path.glob("*.png"):
        _png(path)


def test_ban_maps_label_the_steps_with_the_given_words(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(attention, "save_figure", lambda figure, out, dpi: figures.append(figure) or out)
    maps = np.full((1, 2, 3), 1 / 6)
    words = ["one", "dog", "runs"]
    attention.draw_ban_maps({"maps": maps, "names": ["box", "word"], "labels": [["0", "1"], words]},
                            tmp_path / "x.png", title="a caption " * 20)
    axis = figures[0].axes[0]
    assert [label.get_text() for label in axis.get_xticklabels()] == words
    assert [label.get_text() for label in axis.get_yticklabels()] == ["0", "1"]
    assert "\n" in figures[0]._suptitle.get_text()  # a long title is wrapped to the figure, not cut
    with pytest.raises(ValueError, match="labels for"):
        attention.draw_ban_maps({"maps": maps, "names": ["box", "word"], "labels": [["0"], words]}, tmp_path / "y.png")
