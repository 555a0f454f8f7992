"""The polyfuse command: train, evaluate, predict, compare, plot, and one-line errors."""

import csv
import json
import statistics

import pytest

from polyfuse.cli.main import main

QUIET = ["--no-progress", "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_train_evaluate_predict_plot(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(config_file), "--out", str(run), "--set", "trainer.max_epochs=3", *QUIET]) == 0
    printed = capsys.readouterr().out
    assert f"run directory: {run}" in printed and "test: loss" in printed
    best = run / "checkpoints" / "best.safetensors"
    results = json.loads((run / "results.json").read_text())
    assert results["epochs"] == 3

    assert main(["evaluate", "--checkpoint", str(best), "--out", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text()) == pytest.approx(results["test"], abs=1e-6)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(best), "--split", "val"]) == 0
    shown = dict(line.split() for line in capsys.readouterr().out.splitlines())
    assert float(shown["acc"]) == pytest.approx(results["validation"]["acc"], abs=1e-4)

    assert main(["predict", "--checkpoint", str(best), "--out", str(tmp_path / "p.csv")]) == 0
    with (tmp_path / "p.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 160

    assert main(["plot", "--run", str(run), "--out", str(tmp_path / "curves.png")]) == 0
    assert main(["plot", "--checkpoint", str(best), "--sample", "3", "--out", str(tmp_path / "man.png")]) == 0
    for name in ("curves.png", "man.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_ban_attention_plot(config_file, tmp_path):
    run = tmp_path / "ban"
    assert main(["train", "--config", str(config_file), "--model", "ban", "--out", str(run), "--max-epochs", "1", *QUIET]) == 0
    out = tmp_path / "ban.png"
    assert main(["plot", "--checkpoint", str(run / "checkpoints/best.safetensors"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    assert main(["plot", "--checkpoint", str(run / "checkpoints/best.safetensors"), "--sample", "999", "--out", str(out)]) == 2


def test_compare_table_is_mean_and_std_over_seeds(config_file, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "--config", str(config_file), "--models", "man,concat", "--seeds", "2", "--out", str(out), *QUIET])
    assert code == 0
    with (out / "runs.csv").open() as handle:
        runs = list(csv.DictReader(handle))
    assert [(r["model"], r["seed"]) for r in runs] == [("man", "0"), ("man", "1"), ("concat", "0"), ("concat", "1")]
    with (out / "summary.csv").open() as handle:
        summary = {r["model"]: r for r in csv.DictReader(handle)}
    for model in ("man", "concat"):
        accuracies = [float(r["acc"]) for r in runs if r["model"] == model]
        assert float(summary[model]["acc_mean"]) == pytest.approx(statistics.fmean(accuracies))
        assert float(summary[model]["acc_std"]) == pytest.approx(statistics.stdev(accuracies))
    table = (out / "summary.md").read_text()
    mean, std = 100 * statistics.fmean(accuracies), 100 * statistics.stdev(accuracies)
    assert "| concat (n=2) | " in table and f"{mean:.1f} ± {std:.1f}" in table
    assert table in capsys.readouterr().out


def error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--model", "nope"], "model.fusion: unknown fusion module 'nope'; known: ban, concat, hoca, lmf, lowrank_hoca, maf, man, tfn"),
        (["--set", "trainer.max_epoch=3"], "unknown config key 'trainer.max_epoch' (did you mean 'max_epochs'?); known keys under 'trainer':"),
        (["--data", "missing.npz"], "data file not found: missing.npz"),
        (["--set", "model.options.man.size=3"], "unknown config key 'model.options.man.size'; known keys under 'model.options.man': attention_dim"),
        (["--model", "ban", "--set", "model.input_groups={}"], "BAN takes at most 2 inputs but the data has 3 modalities"),
        (["--strategy", "warp"], "warp"),
    ],
)
def test_train_errors_are_one_line(config_file, tmp_path, capsys, arguments, message):
    code = main(["train", "--config", str(config_file), "--out", str(tmp_path / "r"), *QUIET, *arguments])
    assert code == 2
    line = error_line(capsys)
    assert line.startswith("polyfuse train: error: ") and message in line


def test_file_errors_are_one_line(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "config file not found" in error_line(capsys)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "none.safetensors")]) == 2
    assert "checkpoint not found" in error_line(capsys)
    pickled = tmp_path / "model.ckpt"
    pickled.write_bytes(b"\x80\x04not really")
    assert main(["predict", "--checkpoint", str(pickled), "--out", str(tmp_path / "p.csv")]) == 2
    assert "never loaded" in error_line(capsys)
    assert main(["compare", "--config", str(tmp_path / "none.yaml"), "--models", "man"]) == 2
    assert "config file not found" in error_line(capsys)


def test_bad_flags_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--epochs", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --epochs 3" in capsys.readouterr().err


def test_resume_from_the_command_line(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(config_file), "--out", str(run), *QUIET]) == 0
    first = capsys.readouterr().out.splitlines()[-1]
    (run / "results.json").unlink()
    assert main(["train", "--resume", str(run), *QUIET]) == 0  # nothing left to train: same result
    assert capsys.readouterr().out.splitlines()[-1] == first
    assert main(["train", "--resume", str(run), "--seed", "3"]) == 2
    assert "only --no-progress and --quiet may be added" in error_line(capsys)
