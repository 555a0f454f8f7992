"""``polyfuse bench compile`` on the eager backend (the inductor run is the documented
command; compiling takes tens of seconds per module)."""

import pytest
import torch

from polyfuse.bench.compile import ordered_modules, run_compile_bench


def test_rows_pair_each_module_with_its_compiled_self():
    payload = run_compile_bench(["concat", "lmf"], batch=4, repeats=2, warmup=0, backend="eager")
    assert [row["module"] for row in payload["rows"]] == ["concat", "lmf"]
    for row in payload["rows"]:
        assert row["max_abs_difference"] <= 1e-4  # same graph: outputs agree
        for key in ("speedup_forward", "speedup_forward_backward"):
            ratio = row[key]
            assert ratio["rounds"] == 2 and ratio["minimum"] <= ratio["median"] <= ratio["maximum"]
    concat, lmf = payload["rows"]
    # Concat traces as one graph; LMF's LSTM runs eagerly between two graphs (and each
    # is traced again once inputs require gradients).
    assert concat["fullgraph"] and concat["graphs"] == 2
    assert not lmf["fullgraph"] and lmf["graphs"] == 4
    settings = payload["settings"]
    assert settings["backend"] == "eager" and settings["mode"] == "default" and settings["timer"] == "perf_counter"
    assert payload["machine"]["device"] == "cpu"
    assert payload["table"].count("\n") == 3  # header, rule, two rows
    assert "| lmf | no (LSTM eager) | 4 |" in payload["table"]


def test_the_modules_whose_compiled_form_lost_come_first():
    order = ordered_modules(None)
    assert order[:4] == ["lmf", "tfn", "man", "ban"] and sorted(order) == sorted(set(order))
    assert ordered_modules(["man", "concat"]) == ["man", "concat"]


def test_an_unknown_module_is_refused():
    with pytest.raises(ValueError, match="unknown fusion module 'nope'"):
        run_compile_bench(["nope"], backend="eager")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_compile_bench(["concat"], backend="eager", device="cuda")


def test_time_budget_stops_new_modules():
    payload = run_compile_bench(["concat", "lmf"], batch=2, repeats=1, warmup=0, backend="eager", time_budget_s=0.0)
    assert payload["rows"] == [{"module": name, "not_run": "time budget of 0 s spent"} for name in ("concat", "lmf")]
    assert "| lmf | not run: time budget of 0 s spent |" in payload["table"]
