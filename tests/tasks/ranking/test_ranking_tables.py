"""The EX1 / EX2 tables of a comparison of ranking models (polyfuse.tasks.ranking.tables),
from the runs.csv and results.json files that `polyfuse compare` leaves."""

import json

import pytest

from polyfuse.tasks.ranking.tables import METRIC_COLUMNS, ranking_tables

_CHANCE = {"chance_t2v_R@1": 10.0, "chance_t2v_R@5": 50.0, "chance_t2v_R@10": 100.0,
           "chance_v2t_R@1": 10.0, "chance_v2t_R@5": 45.0, "chance_v2t_R@10": 90.0}


def _metrics(base: float) -> dict:
    return {column: base + k for k, column in enumerate(METRIC_COLUMNS)}


def _write(folder, runs, *, shuffled=True, references=None):
    lines = ["model,seed,epochs"]
    for model, seed, base, seconds in runs:
        lines.append(f"{model},{seed},3")
        run = folder / model / f"seed{seed}"
        run.mkdir(parents=True)
        results = {"test": {**_metrics(base), **_CHANCE}, "train_seconds": seconds}
        if shuffled:
            results["test_shuffled_words"] = _metrics(base - 1)
        if references:
            results["references"] = references
        (run / "results.json").write_text(json.dumps(results))
    (folder / "runs.csv").write_text("\n".join(lines) + "\n")


def test_rows_are_mean_and_std_over_seeds_after_chance_and_bounds(tmp_path):
    bounds = {f"{kind}_R@{k}": v for kind, scale in (("caption", 3), ("events", 1)) for k, v in
              ((1, 1.0 * scale), (5, 5.0 * scale), (10, 10.0 * scale))}
    _write(tmp_path, [("man", 0, 10.0, 4.0), ("man", 1, 20.0, 6.0), ("mean", 0, 30.0, 2.0)], references=bounds)
    text = ranking_tables(tmp_path)
    ex1, ex2 = text.split("EX2 (words of each caption shuffled)")
    assert ex1.startswith("EX1 (captions as written)")
    # man: seeds at 10 and 20, so every column is its mean ± the sample std 7.1; mean: one seed, no std
    assert "| man (n=2) | 15.0 ± 7.1 | 16.0 ± 7.1 |" in ex1 and "| 5 |" in ex1.split("| man (n=2) |")[1].splitlines()[0]
    assert "| mean (n=1) | 30.0 | 31.0 |" in ex1
    assert "| man (n=2) | 14.0 ± 7.1 |" in ex2 and "| mean (n=1) | 29.0 |" in ex2
    assert "| chance | 10.0 | 50.0 | 100.0 | - | 10.0 | 45.0 | 90.0 | - | - |" in ex1
    assert "| bound: perfect caption match | 3.0 | 15.0 | 30.0 | - |" in ex1
    assert "| bound: events known, relation not | 1.0 | 5.0 | 10.0 | - |" in ex2
    assert ex1.index("| chance |") < ex1.index("| bound:") < ex1.index("| man (n=2) |") < ex1.index("| mean (n=1) |")


def test_without_shuffled_runs_there_is_no_ex2_and_a_run_without_test_metrics_is_named(tmp_path):
    _write(tmp_path, [("concat", 0, 5.0, 1.0)], shuffled=False)
    text = ranking_tables(tmp_path)
    assert "EX2" not in text and "bound" not in text and "| concat (n=1) | 5.0 |" in text
    broken = tmp_path / "concat" / "seed0" / "results.json"
    broken.write_text(json.dumps({"test": {}}))
    with pytest.raises(ValueError, match=f"{broken}: no test metrics"):
        ranking_tables(tmp_path)
