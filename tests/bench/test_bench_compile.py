"""``polyfuse bench compile`` on the eager backend (the inductor run is the documented
command; compiling takes tens of seconds per module)."""

import pytest

from polyfuse.bench.compile import run_compile_bench


def test_rows_pair_each_module_with_its_compiled_self():
    payload = run_compile_bench(["concat", "lmf"], batch=4, repeats=2, warmup=0, backend="eager")
    assert [row["module"] for row in payload["rows"]] == ["concat", "lmf"]
    for row in payload["rows"]:
        assert row["max_abs_difference"] <= 1e-4  # same graph: outputs agree
        for key in ("speedup_forward", "speedup_forward_backward"):
            ratio = row[key]
            assert ratio["rounds"] == 2 and ratio["minimum"] <= ratio["median"] <= ratio["maximum"]
    assert payload["settings"]["backend"] == "eager"
    assert payload["table"].count("\n") == 3  # header, rule, two rows


def test_an_unknown_module_is_refused():
    with pytest.raises(ValueError, match="unknown fusion module 'nope'"):
        run_compile_bench(["nope"], backend="eager")
