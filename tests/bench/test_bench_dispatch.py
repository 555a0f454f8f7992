"""``polyfuse bench ops``: the dispatch counter, the CLI and the BENCHMARKS.md section."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from polyfuse.bench.dispatch import (
    OpsSettings,
    count_operations,
    ops_inputs,
    ops_markdown,
    run_ops_bench,
)
from polyfuse.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--modules", "concat lmf", "--batch", "3", "--dims", "6 5 4", "--lengths", "3 4 2",
        "--out-dim", "4", "--top", "3", "--quiet"]


def test_the_counter_counts_hand_known_functions_exactly():
    a, b, c = torch.randn(3, 4).unbind(0)
    counter = count_operations(lambda: a + b * c)
    assert counter.total == 2 and dict(counter.by_name) == {"aten.mul": 1, "aten.add": 1}
    # A linear map of a matrix is addmm of the transposed weight; of a 3-d input the
    # input is flattened to a matrix first and the result viewed back.
    weight, bias, matrix = torch.randn(2, 3), torch.randn(2), torch.ones(5, 3)
    assert dict(count_operations(lambda: F.linear(matrix, weight, bias)).by_name) == {
        "aten.t": 1, "aten.addmm": 1}
    # creating a tensor is an operation too
    assert dict(count_operations(lambda: F.linear(torch.ones(5, 3), weight)).by_name) == {
        "aten.ones": 1, "aten.t": 1, "aten.mm": 1}
    x = torch.ones(4, 5, 3)
    assert dict(count_operations(lambda: F.linear(x, weight, bias)).by_name) == {
        "aten.view": 2, "aten.t": 1, "aten.addmm": 1}
    # Backward: the seed gradient (ones_like), sum's backward (expand), one mul per
    # factor, one detach per leaf as its gradient is stored.
    p, q = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    counter = count_operations(lambda: (p * q).sum().backward())
    assert dict(counter.by_name) == {"aten.mul": 3, "aten.sum": 1, "aten.ones_like": 1,
                                     "aten.expand": 1, "aten.detach": 2}
    assert counter.total == 8


def test_inputs_are_seeded_and_padded_at_random_within_their_lengths():
    settings = OpsSettings(batch=64, dims=(3, 2), lengths=(5, 1))
    inputs, masks = ops_inputs(settings, 2)
    again, again_masks = ops_inputs(settings, 2)
    assert all(torch.equal(u, v) for u, v in zip(inputs + masks, again + again_masks, strict=True))
    assert [tuple(x.shape) for x in inputs] == [(64, 5, 3), (64, 1, 2)]
    real = masks[0].sum(dim=1)
    assert set(real.tolist()) == {1, 2, 3, 4, 5}  # every length in [1, T] drawn in 64 samples
    assert torch.equal(masks[0], torch.arange(5)[None, :] < real[:, None])  # a prefix is real
    assert bool(masks[1].all())
    with pytest.raises(ValueError, match="must pair up"):
        OpsSettings(dims=(3, 2), lengths=(5,))


def test_a_module_with_known_operations_is_counted_as_dispatched():
    payload = run_ops_bench(["concat"], OpsSettings(batch=2, dims=(3, 2), lengths=(2, 2), out_dim=2))
    row = payload["rows"][0]
    assert row["modalities"] == 2 and 0 < row["forward"] < row["forward_backward"]
    assert sum(count for _, count in row["forward_top"]) <= row["forward"]
    counts = [count for _, count in row["forward_backward_top"]]
    assert counts == sorted(counts, reverse=True)
    from polyfuse._checks import get_validation

    assert payload["settings"]["validation"] == get_validation()


def test_cli_writes_counts_with_a_baseline_and_the_docs_script_renders_them(tmp_path, capsys):
    before, after = tmp_path / "before", tmp_path / "after"
    assert main(["bench", "ops", *TINY, "--output-dir", str(before)]) == 0
    first = json.loads((before / "ops.json").read_text())
    assert [row["module"] for row in first["rows"]] == ["concat", "lmf"]
    assert all(len(row["forward_top"]) == 3 for row in first["rows"])
    assert main(["bench", "ops", *TINY, "--baseline", str(before / "ops.json"),
                 "--output-dir", str(after)]) == 0
    second = json.loads((after / "ops.json").read_text())
    for old, new in zip(first["rows"], second["rows"], strict=True):
        # counts are deterministic: the same code counts the same operations again
        assert (new["forward"], new["forward_backward"]) == (old["forward"], old["forward_backward"])
        assert new["baseline"] == {"commit": first["settings"]["commit"] or "unknown",
                                   "forward": old["forward"], "forward_backward": old["forward_backward"]}
    printed = capsys.readouterr().out
    assert "| concat |" in printed and "Before and after" in printed

    spec = importlib.util.spec_from_file_location("write_benchmarks_md", ROOT / "scripts" / "write_benchmarks_md.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    markdown_path = tmp_path / "BENCHMARKS.md"
    assert script.main(["--results", str(after), "--output", str(markdown_path)]) == 0
    markdown = markdown_path.read_text()
    assert "## Operations dispatched per forward and per forward+backward" in markdown
    lmf = second["rows"][1]
    assert f"| lmf | {lmf['forward']:,} | {lmf['forward_backward']:,} |" in markdown
    assert f"--baseline {before / 'ops.json'}" in markdown
    assert markdown.count("| lmf |") == 2  # the counts table and the before/after table


def test_a_baseline_of_other_sizes_is_refused(tmp_path, capsys):
    assert main(["bench", "ops", *TINY, "--output-dir", str(tmp_path)]) == 0
    other = [*TINY[:2], "--batch", "4", *TINY[4:]]
    assert main(["bench", "ops", *other, "--baseline", str(tmp_path / "ops.json"),
                 "--output-dir", str(tmp_path / "b")]) == 2
    assert "the baseline was counted with batch=3, this run with 4" in capsys.readouterr().err


def test_markdown_without_baseline_has_one_table():
    payload = {"settings": {**OpsSettings().__dict__, "validation": "full", "torch": "x", "commit": "abc"},
               "rows": [{"module": "m", "forward": 1234, "forward_backward": 5678,
                         "forward_top": [["aten.view", 7]], "forward_backward_top": [["aten.mul", 9]]}]}
    text = "\n".join(ops_markdown(payload))
    assert "| m | 1,234 | 5,678 | view 7 | mul 9 |" in text
    assert "Before and after" not in text and "commit abc" in text
