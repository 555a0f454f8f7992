"""Every benchmark runs on tiny sizes and writes valid JSON; the exact modes respect the
memory bound; plots and docs/BENCHMARKS.md are produced from the results."""

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from polyfuse.bench import approximation, complexity, paper, targets
from polyfuse.bench.results import read_results, write_results
from polyfuse.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = dataclasses.replace(
    complexity.QUICK, modalities=(2, 3), lengths=(4, 8), random_features=(8,), batch_sizes=(2,),
    base_length=4, base_random_features=8, base_batch=2, hidden_dim=8, heads=2,
)


def assert_valid_json(payload):
    text = json.dumps(payload, allow_nan=False)
    assert json.loads(text)["benchmark"] == payload["benchmark"]
    assert {"created", "machine", "settings", "polyfuse"} <= set(payload)


def test_complexity_runs_and_bounds_the_exact_modes():
    settings = dataclasses.replace(TINY, exact_memory_bound=20_000)
    payload = complexity.run_complexity(settings, sweeps=("modalities", "length", "random_features"))
    assert_valid_json(payload)
    rows = payload["rows"]
    statuses = {(row["model"], row["sweep"], row["modalities"], row["length"]): row for row in rows}
    ok = statuses[("man-had", "modalities", 3, 4)]
    assert ok["status"] == "ok" and ok["flops"] > 0 and ok["peak_bytes"] > 0
    assert ok["forward_s"]["median"] > 0 and ok["forward_backward_s"]["median"] > 0
    # 2 x 2 x 8^3 entries need more than 20 kB: not run, with the prediction.
    skipped = statuses[("man-exact", "length", 3, 8)]
    assert skipped["status"] == "not run" and "would need" in skipped["reason"]
    assert skipped["predicted_bytes"] == complexity.predicted_tensor_bytes(
        modalities=3, length=8, batch=2, heads=2, head_dim=4, backward=True) > 20_000
    assert statuses[("ban", "modalities", 3, 4)]["status"] == "not applicable"
    assert statuses[("ban", "modalities", 2, 4)]["status"] == "ok"
    assert {row["model"] for row in rows if row["sweep"] == "random_features"} == {"man-had"}


def test_tfn_guard_is_recorded_as_not_run():
    settings = dataclasses.replace(TINY, models=("tfn",), modalities=(6,), hidden_dim=8, heads=2)
    row = complexity.run_complexity(settings, sweeps=("modalities",))["rows"][0]
    assert row["status"] == "not run" and "max_fused_size" in row["reason"]


def test_predicted_tensor_bytes_bounds_a_measured_peak():
    settings = dataclasses.replace(TINY, models=("man-exact", "man-hadamard"), lengths=(10,),
                                   backward=False, repeats=1)
    for row in complexity.run_complexity(settings, sweeps=("length",))["rows"]:
        predicted = complexity.predicted_tensor_bytes(
            modalities=3, length=10, batch=2, heads=2, head_dim=4, backward=False)
        assert row["peak_bytes"] <= predicted * 1.5


def test_paper_runs_and_reports_ratios():
    payload = paper.run_paper(lengths=(5,), repeats=1, warmup=0, timing=False)
    assert_valid_json(payload)
    variants = payload["results"][0]["variants"]
    assert set(variants) == {"MAN", "w/o HAD", "w/o CAO", "w/o LSC"}
    assert variants["MAN"]["ratio_to_man"]["flops_total"] == 1.0
    assert variants["w/o HAD"]["paper_flops"] == 10.23e6
    assert variants["w/o LSC"]["ratio_to_man"]["paper_flops"] == pytest.approx(3.07e5 / 3.87e5)


def test_approximation_runs_and_predicts():
    settings = dataclasses.replace(approximation.QUICK, modalities=(2,), random_features=(16,),
                                   scales=(0.3,), seeds=2, kernel_draws=50, choice_random_features=())
    payload = approximation.run_approximation(settings)
    assert_valid_json(payload)
    assert len(payload["kernel"]) == len(settings.kernel_norms) * len(settings.kernel_random_features)
    for row in payload["kernel"]:
        assert row["predicted_mse_iid"] > 0 and row["measured_mse_iid"] > 0
    (row,) = payload["attention"]
    assert 0 < row["error_gerf"] < 10 and 0 < row["error_arf"] < 10
    assert row["improvement"] == pytest.approx(row["error_arf"] / row["error_gerf"])
    # The ARF column is appendix Eq. 12 at the tuples' mean |z|^2, recomputed here.
    features, _, _ = approximation._draw_case(2, 0.3, 16, settings.seed + 2000, settings)
    means = [a[0].mean(0) for a in features]
    z2 = sum(float((a[0] - c).square().sum(-1).mean()) for a, c in zip(features, means, strict=True))
    z2 += float(sum(means).square().sum())
    first = math.expm1(z2) / 16
    features, _, _ = approximation._draw_case(2, 0.3, 16, settings.seed + 2001, settings)
    means = [a[0].mean(0) for a in features]
    z2 = sum(float((a[0] - c).square().sum(-1).mean()) for a, c in zip(features, means, strict=True))
    z2 += float(sum(means).square().sum())
    assert row["kernel_variance_arf"] == pytest.approx((first + math.expm1(z2) / 16) / 2)


def test_kernel_mse_follows_eq_12_with_enough_draws():
    settings = dataclasses.replace(approximation.QUICK, kernel_random_features=(32,), kernel_norms=(0.5,),
                                   kernel_draws=20000)
    row = approximation.kernel_errors(settings)[0]
    assert row["measured_mse_iid"] == pytest.approx(row["predicted_mse_iid"], rel=0.15)
    assert row["measured_mse_orthogonal"] <= row["measured_mse_iid"] * 1.1
    assert row["mean_estimate_iid"] == pytest.approx(row["exact"], rel=0.01)


def test_targets_run_on_quick_sizes():
    payload = targets.run_targets(repeats=1, warmup=0, sizes=targets.QUICK_SIZES)
    assert_valid_json(payload)
    assert payload["settings"]["issue_sizes"] is False
    assert set(payload["targets"]) == set(targets.TARGETS)
    for target in payload["targets"].values():
        assert target["value"] > 0 and isinstance(target["passed"], bool)
    flop_rate = payload["targets"]["had_flop_rate_fraction"]
    assert flop_rate["had_flops_counted"] > flop_rate["had_flops_by_hand"]


def test_cli_writes_json_plots_and_the_docs_script_renders_them(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["bench", "complexity", "--preset", "quick", "--sweeps", "modalities",
                 "--models", "man-had,man-exact,lmf", "--modalities", "2 3", "--lengths", "4",
                 "--base", "3 4 8 2", "--hidden-dim", "8", "--heads", "2", "--no-backward",
                 "--output-dir", str(out), "--quiet"]) == 0
    assert main(["bench", "paper", "--lengths", "4", "--no-timing", "--output-dir", str(out),
                 "--quiet"]) == 0
    assert main(["bench", "approximation", "--preset", "quick", "--kernel-draws", "20",
                 "--seeds", "1", "--modalities", "2", "--random-features", "16", "--output-dir", str(out), "--quiet"]) == 0
    payload = read_results(out / "complexity.json")
    assert [row["modalities"] for row in payload["rows"] if row["model"] == "lmf"] == [2, 3]
    for name in ("complexity_modalities.png", "paper_flops.png", "approximation_kernel_mse.png",
                 "approximation_attention_error.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # targets: write a small fake result rather than timing the sizes here.
    fake = targets.run_targets(repeats=1, warmup=0, sizes=targets.QUICK_SIZES)
    write_results(out / "targets.json", fake)

    spec = importlib.util.spec_from_file_location("write_benchmarks_md", ROOT / "scripts" / "write_benchmarks_md.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    markdown_path = tmp_path / "BENCHMARKS.md"
    assert script.main(["--results", str(out), "--output", str(markdown_path)]) == 0
    markdown = markdown_path.read_text()
    for heading in ("## Speed targets", "## The MAN paper's CMU-MOSI figures beside ours",
                    "## Cost against the number of modalities", "## Approximation error of had mode"):
        assert heading in markdown
    assert "not the issue's sizes" in markdown
    assert "do not edit by hand" in markdown
    capsys.readouterr()


def test_cli_rejects_bad_options(capsys):
    assert main(["bench", "complexity", "--models", "nope", "--no-plots", "--quiet"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["bench", "complexity", "--exact-memory-bound", "lots", "--quiet"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_trained_model_errors_switch_the_estimator_of_each_layer(tmp_path):
    """The layers pass their own estimator to multilinear_attention: the benchmark must set
    it on them (a patched default went unnoticed and gave ARF = gerf)."""
    from polyfuse.engine.config import deep_merge, resolve_config
    from polyfuse.engine.run import load_model, train

    config = {
        "output_dir": str(tmp_path / "runs"), "task": {"type": "sentiment"},
        "data": {"source": "synthetic:samples=80,lengths=5/6/4,dims=4/3/5,signal=4.0", "batch_size": 16},
        "model": {"fusion": "man", "fusion_dim": 8, "out_dim": 8,
                  "encoder": {"type": "linear", "hidden_dim": 8},
                  "options": {"man": {"hidden_dim": 8, "heads": 2, "num_random_features": 4, "chunks": 2,
                                      "mode": "had"}}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "progress_bar": False, "quiet": True,
                    "num_threads": 1, "patience": 0},
    }
    run = tmp_path / "run"
    train(resolve_config(deep_merge({}, config)), run_dir=run)
    checkpoint = str(run / "checkpoints" / "best.safetensors")
    result = approximation.trained_model_errors(checkpoint, split="test")
    gerf, arf = result["relative_error_had_gerf"], result["relative_error_had_arf"]
    assert gerf > 0 and arf > 0 and abs(gerf - arf) > 1e-3 * max(gerf, arf)
    # exact attention has no random features: its metrics differ from had's
    assert result["metrics_exact"] != result["metrics_had_gerf"]
    task, _ = load_model(checkpoint)
    assert {(layer.mode, layer.estimator) for layer in task.modules() if hasattr(layer, "estimator")} == {("had", "gerf")}


def test_choice_rows_measure_each_way_of_computing_the_attention():
    from polyfuse.bench import choices

    settings = dataclasses.replace(approximation.QUICK, modalities=(2,), random_features=(16,), scales=(0.3,),
                                   seeds=1, kernel_draws=20, choice_random_features=(8, 256), choice_repeats=1)
    payload = approximation.run_approximation(settings)
    assert_valid_json(payload)
    rows = payload["choices"]
    assert [row["choice"] for row in rows] == [choices.CHOICES[0].label] + [c.label for c in choices.CHOICES[1:]
                                                                           for _ in range(2)]
    # fresh draws in training or one: the same attention, the same errors
    assert rows[-1]["output_error"] == rows[-3]["output_error"]
    assert rows[0]["output_error"] == 0 and rows[0]["attention_error"] == 0
    by = {(row["choice"], row["random_features"]): row for row in rows}
    default = choices.CHOICES[3].label
    # More features, smaller error; the exact LSC part far below the estimated one (issue 27).
    assert by[default, 256]["output_error"] < by[default, 8]["output_error"]
    assert by[default, 256]["output_error"] < 0.3 * by[choices.CHOICES[2].label, 256]["output_error"]
    assert all(row["forward_ms"] > 0 and row["forward_backward_ms"] > 0 for row in rows)
    assert "| exact | – | 0 | 0 |" in payload["choice_table"]


def test_the_task_column_trains_the_demo_man_of_each_choice_and_evaluates_it_exact_too():
    from polyfuse.bench import choices
    from polyfuse.demo import MAN_OPTIONS, DemoModel, run_demo

    choice = choices.CHOICES[4]  # had, fresh draws in training
    accuracy, evaluated_exact = choices._task_accuracy(choice, 16, epochs=1, seeds=1, num_samples=300)
    options = {**MAN_OPTIONS, "mode": "had", "estimator": "gerf", "exact_lsc": True, "num_random_features": 16,
               "redraw_in_training": True}
    (result,) = run_demo(num_samples=300, epochs=1, seed=0, models=(DemoModel("x", "man", options),),
                         progress=False, keep_models=True)
    assert accuracy == result.test_accuracy
    for layer in result.model.fusion.layers:
        layer.mode = "exact"
    with torch.no_grad():
        logits = result.model(result.test.inputs, result.test.masks)
    assert evaluated_exact == ((logits > 0) == (result.test.labels > 0)).float().mean().item()
