"""``polyfuse bench peers``: weight mappings, skipped and refused rows, train mode, peak
memory, the guard against a baseline (``--against``), the CLI.

The fake peer below is a temporary folder laid out like MultiBench (``fusions/
common_fusions.py``, ``unimodals/common_models.py``) whose modules are written here
from the TFN and LMF papers with explicit loops over the entries, in MultiBench's
layout (the constant 1 first); polyfuse must match them through the weight mapping.
The real peers are read from the checkouts ``MAN``, ``ban-vqa`` and ``MultiBench`` in the
folder that the environment variable ``POLYFUSE_PEERS`` names (docs/TESTING.md): an
explicit opt-in, those tests skip when it is unset or lacks their checkout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from polyfuse.bench.peer_rows import ROWS, Pair, RowSpec, tfn_permutation
from polyfuse.bench.peers import (
    compare_to_baseline,
    format_changes,
    format_table,
    peer_commit,
    run_peers,
)
from polyfuse.cli.main import main

_FAKE_FUSIONS = '''
import torch
from torch import nn


class TensorFusion(nn.Module):
    """Entry (k_1, ..., k_m) row-major = prod_j [1, z_j][k_j], one sample and entry at a time."""

    def forward(self, modalities):
        padded = [torch.cat([torch.ones(z.shape[0], 1), z], dim=1) for z in modalities]
        sizes = [p.shape[1] for p in padded]
        rows = []
        for b in range(modalities[0].shape[0]):
            entries = []
            for flat in range(int(torch.tensor(sizes).prod())):
                rest, value = flat, torch.ones(())
                for j in reversed(range(len(sizes))):
                    rest, k = divmod(rest, sizes[j])
                    value = value * padded[j][b, k]
                entries.append(value)
            rows.append(torch.stack(entries))
        return torch.stack(rows)


class LowRankTensorFusion(nn.Module):
    """h[b, o] = sum_r w_r prod_j sum_i [1, z_j][i] W_j[r, i, o] + bias[o], by loops."""

    def __init__(self, input_dims, output_dim, rank, flatten=True):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.factors = [nn.Parameter(torch.randn(rank, d + 1, output_dim, generator=generator))
                        for d in input_dims]
        self.fusion_weights = nn.Parameter(torch.randn(1, rank, generator=generator))
        self.fusion_bias = nn.Parameter(torch.randn(1, output_dim, generator=generator))

    def forward(self, modalities):
        batch, rank, out_dim = modalities[0].shape[0], self.fusion_weights.shape[1], self.fusion_bias.shape[1]
        rows = []
        for b in range(batch):
            row = []
            for o in range(out_dim):
                total = self.fusion_bias[0, o]
                for r in range(rank):
                    term = self.fusion_weights[0, r]
                    for z, factor in zip(modalities, self.factors):
                        padded = torch.cat([torch.ones(1), z[b]])
                        term = term * sum(padded[i] * factor[r, i, o] for i in range(padded.shape[0]))
                    total = total + term
                row.append(total)
            rows.append(torch.stack(row))
        return torch.stack(rows)
'''

_FAKE_MODELS = '''
import torch
from torch import nn
import torchvision  # like MultiBench's: must be stubbed when torchvision is missing


class Linear(nn.Module):
    def __init__(self, indim, outdim, xavier_init=False):
        super().__init__()
        self.fc = nn.Linear(indim, outdim)

    def forward(self, x):
        return x @ self.fc.weight.T + self.fc.bias


class MLP(nn.Module):
    def __init__(self, indim, hiddim, outdim, dropout=False, dropoutp=0.1, output_each_layer=False):
        super().__init__()
        self.fc = nn.Linear(indim, hiddim)
        self.fc2 = nn.Linear(hiddim, outdim)

    def forward(self, x):
        return (x @ self.fc.weight.T + self.fc.bias).clamp(min=0) @ self.fc2.weight.T + self.fc2.bias
'''

_TINY_TFN = {"input_dims": (3, 4, 2), "hidden_dims": (2, 3, 1), "post_fusion_dim": 5, "out_dim": 2, "batch": 3}
_TINY_LMF = {"input_dims": (3, 2, 4), "out_dim": 3, "rank": 2, "batch": 2}
_QUICK = {"threads": (1,), "warmup": 0, "repeats": 2}


def _fake_multibench(root: Path, fusions: str = _FAKE_FUSIONS) -> Path:
    for folder, name, text in [("fusions", "common_fusions.py", fusions), ("unimodals", "common_models.py", _FAKE_MODELS)]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
        (root / folder / name).write_text(textwrap.dedent(text))
    return root


def _tiny_specs() -> dict:
    sizes = {"tfn": _TINY_TFN, "tensor_fusion": _TINY_TFN, "lmf": _TINY_LMF, "low_rank_fusion": _TINY_LMF}
    return {name: dataclasses.replace(ROWS[name], sizes=value) for name, value in sizes.items()}


def test_tfn_permutation_by_hand():
    # ours (i1, i2) over [z1, 1] x [z2, 1] is theirs ((i1 + 1) % 2, (i2 + 1) % 3) over [1, z1] x [1, z2]
    assert tfn_permutation([1, 2]).tolist() == [4, 5, 3, 1, 2, 0]


def test_fake_multibench_rows_equal_and_timed(tmp_path):
    root = _fake_multibench(tmp_path / "MultiBench")
    payload = run_peers({"multibench": root, "man": None, "ban_vqa": None}, specs=_tiny_specs(), **_QUICK)
    rows = {row["name"]: row for row in payload["rows"]}
    for name in ("tfn", "tensor_fusion", "lmf", "low_rank_fusion"):
        assert rows[name]["status"] == "timed", rows[name]
        assert rows[name]["max_abs_difference"] < 1e-5
        assert rows[name]["max_abs_peer_output"] > 0.1  # not a trivial zero output
        ratio = rows[name]["timings"]["1"]["train"]["forward"]["ratio"]
        assert ratio["rounds"] == 2 and ratio["median"] > 0
    # TFN at batch 3 on both sides: the encoders 3 -> 2, 4 -> 3, 2 -> 1 (2 x 3 x 20 FLOPs), then
    # (2+1)(3+1)(1+1) = 24 fused features through 24 -> 5 -> 2 (2 x 3 x (120 + 10)): 900 each.
    assert rows["tfn"]["forward_flops"] == {"polyfuse": 900, "peer": 900}
    assert "| tfn | 1 | 3 | eval |" in format_table(payload) and "MFLOP polyfuse / peer" in format_table(payload)
    assert payload["peers"]["multibench"]["present"] and payload["peers"]["multibench"]["commit"] is None
    (root / "PEER_COMMIT").write_text("49f9be224f342de005b7f001281f33df4301eb22\n")  # a staged copy's record
    assert peer_commit(root) == "49f9be224f342de005b7f001281f33df4301eb22"
    assert "torchvision" not in sys.modules or sys.modules["torchvision"].__spec__ is not None  # stub removed
    assert "fusions" not in sys.modules  # the peer's generic names do not leak


def test_missing_path_is_skipped_with_a_note(tmp_path):
    payload = run_peers({"multibench": tmp_path / "absent", "man": None}, rows=["tensor_fusion", "man"],
                        specs={"tensor_fusion": _tiny_specs()["tensor_fusion"], "man": ROWS["man"]}, **_QUICK)
    tensor_fusion, man = payload["rows"]
    assert tensor_fusion["status"] == "skipped" and "no checkout at" in tensor_fusion["note"]
    assert man["status"] == "skipped" and "wangzih98/MAN" in man["note"]
    assert "skipped" in format_table(payload)


def test_row_with_different_outputs_is_refused(tmp_path):
    wrong = _FAKE_FUSIONS.replace("torch.cat([torch.ones(z.shape[0], 1), z]", "torch.cat([z, torch.ones(z.shape[0], 1)]")  # constant last
    root = _fake_multibench(tmp_path / "MultiBench", wrong)
    payload = run_peers({"multibench": root}, rows=["tensor_fusion"], specs=_tiny_specs(), **_QUICK)
    (row,) = payload["rows"]
    assert row["status"] == "refused" and not row["equal"] and "timings" not in row
    assert row["max_abs_difference"] > 1e-3


def test_broken_peer_is_skipped(tmp_path):
    root = _fake_multibench(tmp_path / "MultiBench", "raise ImportError('needs something')\n")
    payload = run_peers({"multibench": root}, rows=["lmf"], specs=_tiny_specs(), **_QUICK)
    assert payload["rows"][0]["status"] == "skipped" and "needs something" in payload["rows"][0]["note"]


def test_cli_writes_json_and_table(tmp_path, capsys, monkeypatch):
    root = _fake_multibench(tmp_path / "MultiBench")
    monkeypatch.setitem(ROWS, "tensor_fusion", _tiny_specs()["tensor_fusion"])  # the fake is slow
    out = tmp_path / "results"
    code = main(["bench", "peers", "--multibench", str(root), "--rows", "tensor_fusion", "--thread-counts", "1",
                 "--repeats", "1", "--warmup", "0", "--output-dir", str(out), "--quiet"])
    assert code == 0
    payload = json.loads((out / "peers.json").read_text())
    assert payload["benchmark"] == "peers" and payload["settings"]["threads"] == [1]
    assert payload["machine"]["torch"] == torch.__version__
    assert "| tensor_fusion | 1 |" in capsys.readouterr().out
    report = (out / "peers.md").read_text()
    assert f"--multibench {root} --rows 'tensor_fusion' --thread-counts '1' --repeats 1 --warmup 0" in report
    assert "| multibench | github.com/pliang279/MultiBench | not a git checkout |" in report


# ---------------------------------------------------------------------------
# The real peers (skipped when their checkouts are absent)
# ---------------------------------------------------------------------------

_VARIABLE = "POLYFUSE_PEERS"


def _checkout(folder: str) -> Path:
    """The peer's checkout ``$POLYFUSE_PEERS/<folder>``; skips the test when the variable is
    unset or the checkout absent."""
    root = os.environ.get(_VARIABLE)
    if not root:
        pytest.skip(f"{_VARIABLE} is not set: set it to a folder of the peers' checkouts "
                    "MAN, ban-vqa, MultiBench (docs/TESTING.md)")
    path = Path(root) / folder
    if not path.is_dir():
        pytest.skip(f"no checkout {folder} in {_VARIABLE}={root}")
    return path

_SMALL = {
    "man": {**ROWS["man"].sizes, "input_dims": (6, 5, 7), "length": 9, "batch": 3, "value_dim": 3,
            "feature_dim": 4, "out_dim": 2},
    "man_published": {**ROWS["man_published"].sizes, "input_dims": (6, 5, 7), "length": 9, "batch": 3,
                      "value_dim": 3, "feature_dim": 4, "out_dim": 2},
    "ban_small": {**ROWS["ban_small"].sizes, "image_dim": 12, "hidden_dim": 8, "glimpses": 3, "objects": 5,
                  "words": 4, "batch": 3},
    "tfn": ROWS["tfn"].sizes,
    "tensor_fusion": ROWS["tensor_fusion"].sizes,
    "lmf": ROWS["lmf"].sizes,
    "low_rank_fusion": ROWS["low_rank_fusion"].sizes,
}


@pytest.mark.parametrize("name", ["man", "ban_small", "tfn", "tensor_fusion", "lmf", "low_rank_fusion"])
def test_real_peer_mappings_give_equal_outputs(name):
    spec = ROWS[name]
    checkout = _checkout({"man": "MAN", "ban_vqa": "ban-vqa", "multibench": "MultiBench"}[spec.peer])
    specs = {name: dataclasses.replace(spec, sizes=_SMALL[name])}
    payload = run_peers({spec.peer: checkout}, rows=[name], specs=specs, tolerance=1e-5, **_QUICK)
    (row,) = payload["rows"]
    assert row["status"] == "timed", row
    assert row["max_abs_difference"] <= 1e-5 * max(1.0, row["max_abs_peer_output"])
    assert row["max_abs_peer_output"] > 1e-2


def test_real_man_as_published_differs_but_matches_at_one_step():
    checkout = _checkout("MAN")
    published = ROWS["man_published"]
    specs = {"long": dataclasses.replace(published, name="long", sizes=_SMALL["man_published"]),
             "one_step": dataclasses.replace(published, name="one_step", sizes={**_SMALL["man_published"], "length": 1})}
    payload = run_peers({"man": checkout}, specs=specs, **_QUICK)
    long, one_step = payload["rows"]
    assert long["status"] == "refused" and long["max_abs_difference"] > 1e-3
    # With one step per modality the per-step max is a per-sample constant and cancels.
    assert one_step["status"] == "timed" and one_step["max_abs_difference"] < 1e-5


# ---------------------------------------------------------------------------
# Devices: the CUDA path's logic, as far as it runs without a GPU
# ---------------------------------------------------------------------------


def test_batch_sizes_run_every_row_at_each_size(tmp_path):
    root = _fake_multibench(tmp_path / "MultiBench")
    payload = run_peers({"multibench": root}, rows=["tfn"], specs=_tiny_specs(), batch_sizes=(2, 3), **_QUICK)
    rows = payload["rows"]
    assert [(row["name"], row["batch"], row["status"]) for row in rows] == [("tfn", 2, "timed"), ("tfn", 3, "timed")]
    # 300 matrix-product FLOPs per sample on each side (see the TFN count above): batch 2 and 3.
    assert [row["forward_flops"]["polyfuse"] for row in rows] == [600, 900]
    assert payload["settings"]["batch_sizes"] == [2, 3] and payload["settings"]["device"] == "cpu"
    assert all(row["patches"] == [] for row in rows)  # nothing patched on the CPU
    assert "| tfn | 1 | 3 | train |" in format_table(payload)


def test_pair_moves_modules_loose_weights_and_inputs(tmp_path):
    """Pair.to is what puts a row on the GPU; the meta device stands in for it here. The
    peer's plain-list factors and the closure's parameters move with the modules."""
    from polyfuse.bench.peer_rows import built_on_cpu

    root = _fake_multibench(tmp_path / "MultiBench")
    spec = _tiny_specs()["low_rank_fusion"]
    with built_on_cpu():
        pair = spec.build(root, spec.sizes, 0, torch.device("cpu"))
    assert pair.loose and all(t.device.type == "cpu" for t in pair.loose)
    pair.to(torch.device("meta"))
    tensors = [*pair.loose, *pair.inputs, *(p for m in pair.modules for p in m.parameters())]
    assert all(t.device.type == "meta" for t in tensors)
    assert pair.ours(pair.inputs).device.type == "meta"  # the closure sees the moved weights


def test_rows_are_built_on_the_cpu_whatever_the_machine():
    from polyfuse.bench.peer_rows import built_on_cpu

    with built_on_cpu():
        assert not torch.cuda.is_available()
        assert torch.ones(2).cuda().device.type == "cpu"  # a peer's hard-coded .cuda()
    assert torch.Tensor.cuda is not None and torch.cuda.is_available.__module__ == "torch.cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="CUDA is not available"):
        run_peers({"multibench": tmp_path}, rows=["tfn"], specs=_tiny_specs(), device="cuda", **_QUICK)
    assert main(["bench", "peers", "--device", "cuda", "--output-dir", str(tmp_path), "--quiet"]) != 0
    assert "CUDA is not available" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_timer_follows_the_device():
    from polyfuse.bench.measure import call_timer, cuda_event_seconds, wall_seconds

    assert call_timer("cpu") is wall_seconds
    assert call_timer("cuda") is cuda_event_seconds and call_timer(torch.device("cuda", 1)) is cuda_event_seconds


def test_source_patch_is_applied_in_memory_only(tmp_path):
    from polyfuse.bench.peer_rows import describe_patch, peer_modules

    root = tmp_path / "peer"
    root.mkdir()
    source = "def flat(x):\n    return x.view(-1)\n"
    (root / "shapes.py").write_text(source)
    patch = ("shapes", "x.view(-1)", "x.reshape(-1)")
    strided = torch.arange(6.0).reshape(2, 3).T  # not contiguous: view(-1) refuses it
    with peer_modules(root, ["shapes"], patches=[patch]) as modules:
        assert modules["shapes"].flat(strided).tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    with peer_modules(root, ["shapes"]) as modules, pytest.raises(RuntimeError, match="view"):
        modules["shapes"].flat(strided)
    assert (root / "shapes.py").read_text() == source and not list(root.glob("__pycache__"))
    assert describe_patch(patch) == "shapes.py: `x.view(-1)` -> `x.reshape(-1)`"
    missing = ("shapes", "x.view(1, -1)", "x.reshape(1, -1)")
    refused = r"does not apply to .*shapes\.py: the old text occurs 0 times"
    with pytest.raises(ImportError, match=refused), peer_modules(root, ["shapes"], patches=[missing]):
        pass
    assert "shapes" not in sys.modules


def test_real_ban_vqa_with_its_cuda_patch_matches_polyfuse():
    """The row as it is built for CUDA (the patch applied to attention.py in memory), run
    on the CPU: the patch changes no value, and it is listed."""
    from polyfuse.bench.peer_rows import CUDA_PATCHES, built_on_cpu, describe_patch

    checkout = _checkout("ban-vqa")
    source = (checkout / "attention.py").read_text()
    spec = ROWS["ban_small"]
    with built_on_cpu():
        pair = spec.build(checkout, _SMALL["ban_small"], 0, torch.device("cuda"))
    assert pair.patches == [describe_patch(patch) for patch in CUDA_PATCHES["ban_vqa"]]
    assert pair.patches == ["attention.py: `logits.view(-1, self.glimpse, v_num * q_num)` -> "
                            "`logits.reshape(-1, self.glimpse, v_num * q_num)`"]
    for module in pair.modules:
        module.eval()
    with torch.no_grad():
        torch.testing.assert_close(pair.ours(pair.inputs), pair.theirs(pair.inputs), rtol=1e-5, atol=1e-5)
    assert (checkout / "attention.py").read_text() == source


# ---------------------------------------------------------------------------
# Train mode, peak memory and the guard against a baseline (issue 40)
# ---------------------------------------------------------------------------


class _ModeRecorder(torch.nn.Module):
    """A linear layer and dropout that records ``self.training`` at every call."""

    def __init__(self, modes_seen: list[bool]) -> None:
        super().__init__()
        self.linear, self.dropout, self.modes_seen = torch.nn.Linear(6, 4), torch.nn.Dropout(0.5), modes_seen

    def forward(self, x):
        self.modes_seen.append(self.training)
        return self.dropout(self.linear(x))


def _recorder_spec(modes_seen: list[bool]) -> RowSpec:
    """Both sides the same module on the same weights: equal outputs in eval mode."""

    def build(root, sizes, seed, device):
        torch.manual_seed(seed)
        ours, theirs = _ModeRecorder(modes_seen), _ModeRecorder([])
        theirs.load_state_dict(ours.state_dict())
        inputs = [torch.randn(sizes["batch"], 6)]
        return Pair(lambda x: ours(x[0]), lambda x: theirs(x[0]), inputs, [ours, theirs])

    return RowSpec("recorder", "multibench", "a linear layer and dropout on each side", {"batch": 5}, build)


def test_each_mode_is_timed_with_the_modules_in_that_mode(tmp_path):
    seen: list[bool] = []
    payload = run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, **_QUICK)
    (row,) = payload["rows"]
    assert row["status"] == "timed" and set(row["timings"]["1"]) == {"eval", "train"}
    assert set(row["timings"]["1"]["train"]) == {"forward", "forward_backward"}
    # the comparison (one call), the FLOP count (one), then 2 rounds of each pass in eval, then in train
    assert seen == [False, False] + [False] * 4 + [True] * 4
    assert payload["settings"]["modes"] == ["eval", "train"] and "mode" not in payload["settings"]
    assert "| recorder | 1 | 5 | train |" in format_table(payload)

    seen.clear()
    payload = run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, modes=("eval",),
                        **_QUICK)
    assert not any(seen) and set(payload["rows"][0]["timings"]["1"]) == {"eval"}
    with pytest.raises(ValueError, match="modes must be"):
        run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, modes=("test",), **_QUICK)


def test_peak_memory_of_the_rows_asked(tmp_path):
    seen: list[bool] = []
    payload = run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, memory=("recorder",),
                        modes=("train",), **_QUICK)
    memory = payload["rows"][0]["memory"]
    # the same module on each side: the same bytes (a count, not a sample)
    assert memory["polyfuse_mib"] > 0 and memory["polyfuse_mib"] == memory["peer_mib"] and memory["ratio"] == 1.0
    assert not seen[-1]  # measured in eval mode, after the timing in train mode
    assert "| recorder | 5 | " in format_table(payload).split("Peak memory")[1]
    assert payload["settings"]["memory_rows"] == ["recorder"]
    without = run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, **_QUICK)
    assert "memory" not in without["rows"][0] and "Peak memory" not in format_table(without)
    with pytest.raises(ValueError, match="unknown rows"):
        run_peers({"multibench": tmp_path}, specs={"recorder": _recorder_spec(seen)}, memory=("ban",), **_QUICK)


def _timed_row(name: str, ratios: dict[tuple[int, str, str], float], memory: float | None = None) -> dict:
    timings: dict = {}
    for (threads, mode, name_of_pass), ratio in ratios.items():
        timings.setdefault(str(threads), {}).setdefault(mode, {})[name_of_pass] = {"ratio": {"median": ratio}}
    row = {"name": name, "batch": 32, "status": "timed", "timings": timings}
    if memory is not None:
        row["memory"] = {"polyfuse_mib": 80.0 * memory, "peer_mib": 80.0, "ratio": memory}
    return row


def _result(*rows: dict) -> dict:
    return {"benchmark": "peers", "settings": {"device": "cpu", "threads": [1], "modes": ["eval"],
                                               "batch_sizes": None, "memory_rows": []}, "rows": list(rows)}


def _changes(old: float, new: float) -> list:
    key = (1, "eval", "forward_backward")
    return compare_to_baseline(_result(_timed_row("ban_vqa", {key: new})), _result(_timed_row("ban_vqa", {key: old})))


def test_a_ratio_fails_when_much_worse_or_crossing_one():
    assert not _changes(0.80, 0.88)[0].failed  # 10% worse
    worse = _changes(0.80, 0.96)[0]  # 20% worse
    assert worse.failed and worse.reason == "more than 15% worse"
    crossed = _changes(0.95, 1.02)[0]  # under 15% but now slower than the peer
    assert crossed.failed and crossed.reason == "crossed 1.0"
    assert not _changes(1.05, 1.08)[0].failed  # under 15%, already above 1
    assert not _changes(1.30, 0.70)[0].failed  # better
    assert _changes(0.50, 1.20)[0].reason == "more than 15% worse; crossed 1.0"
    change = _changes(0.80, 0.96)[0]
    assert (change.row, change.threads, change.mode, change.measure) == ("ban_vqa b32", 1, "eval", "forward_backward")


def test_missing_ratios_are_reported_not_failed_and_memory_is_held_too():
    forward = (1, "eval", "forward")
    baseline = _result(_timed_row("ban_vqa", {forward: 0.9, (2, "eval", "forward"): 0.9}, memory=0.8),
                       _timed_row("lmf", {forward: 0.9}))
    payload = _result(_timed_row("ban_vqa", {forward: 0.9, (1, "train", "forward"): 0.9}, memory=1.1),
                      {"name": "lmf", "batch": 32, "status": "skipped", "note": "no checkout at /x"},
                      _timed_row("tfn", {forward: 1.2}))
    changes = {(c.row, c.threads, c.mode, c.measure): c for c in compare_to_baseline(payload, baseline)}
    assert [key for key, change in changes.items() if change.failed] == [("ban_vqa b32", None, None, "memory")]
    assert changes[("ban_vqa b32", None, None, "memory")].reason == "more than 15% worse; crossed 1.0"
    assert changes[("ban_vqa b32", 2, "eval", "forward")].reason == "not measured now"
    assert changes[("ban_vqa b32", 1, "train", "forward")].reason == "not measured in the baseline"
    assert changes[("lmf b32", 1, "eval", "forward")].reason == "skipped now: no checkout at /x"
    assert changes[("tfn b32", 1, "eval", "forward")].reason == "row not in the baseline"
    # a row whose outputs now differ from the peer's fails: it is not timed any more
    refused = {"name": "lmf", "batch": 32, "status": "refused", "note": "outputs differ by 0.4 (> 1e-05): not timed"}
    (change,) = compare_to_baseline(_result(refused), _result(_timed_row("lmf", {forward: 0.9})))
    assert change.failed and change.reason.startswith("refused now: outputs differ")


def test_format_changes_one_line_per_ratio():
    key = (1, "eval", "forward_backward")
    changes = compare_to_baseline(_result(_timed_row("ban_vqa", {key: 0.81})), _result(_timed_row("ban_vqa", {key: 0.79})))
    assert format_changes(changes) == ["ban_vqa b32  t1 eval  fwd+bwd  0.79 -> 0.81  (+2.5%)"]
    assert format_changes(_changes(0.80, 0.96))[0].endswith("(+20.0%)  FAIL: more than 15% worse")


def test_cli_against_a_result_file_exits_1_on_a_regression(tmp_path, capsys):
    key = (1, "eval", "forward")
    old, good, bad = tmp_path / "old.json", tmp_path / "good.json", tmp_path / "bad.json"
    old.write_text(json.dumps(_result(_timed_row("ban_vqa", {key: 0.8}), _timed_row("lmf", {key: 0.9}))))
    good.write_text(json.dumps(_result(_timed_row("ban_vqa", {key: 0.85}), _timed_row("lmf", {key: 0.7}))))
    bad.write_text(json.dumps(_result(_timed_row("ban_vqa", {key: 0.85}), _timed_row("lmf", {key: 1.01}))))
    assert main(["bench", "peers", "--against", str(old), "--result", str(good)]) == 0
    out = capsys.readouterr().out
    assert "ban_vqa b32  t1 eval  fwd      0.80 -> 0.85  (+6.2%)" in out and "no regression: 2 ratios compared" in out
    assert main(["bench", "peers", "--against", str(old), "--result", str(bad)]) == 1
    captured = capsys.readouterr()
    assert "lmf b32      t1 eval  fwd      0.90 -> 1.01  (+12.2%)  FAIL: crossed 1.0" in captured.out
    assert captured.err.strip() == f"polyfuse bench peers: 1 of 2 ratios regressed against {old}: lmf b32"
    assert not list(tmp_path.glob("*.md"))  # nothing measured, nothing written


def test_cli_refuses_a_baseline_of_the_old_format_or_another_benchmark(tmp_path, capsys):
    old, ops = tmp_path / "old.json", tmp_path / "ops.json"
    old.write_text(json.dumps({"benchmark": "peers", "settings": {"mode": "eval, float32"}, "rows": []}))
    ops.write_text(json.dumps({"benchmark": "ops", "settings": {}, "rows": []}))
    assert main(["bench", "peers", "--against", str(old), "--result", str(old)]) == 2
    assert "measured before train mode was timed" in capsys.readouterr().err
    assert main(["bench", "peers", "--against", str(ops), "--result", str(old)]) == 2
    assert "is not a 'peers' result (benchmark 'ops')" in capsys.readouterr().err
    assert main(["bench", "peers", "--result", str(old)]) == 2
    assert "give both" in capsys.readouterr().err


def test_cli_against_measures_what_the_baseline_measured(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(ROWS, "recorder", _recorder_spec([]))
    baseline = _result(_timed_row("recorder", {(1, "train", "forward"): 50.0, (1, "train", "forward_backward"): 50.0}))
    baseline["rows"][0]["batch"] = 5
    baseline["settings"] |= {"modes": ["train"], "memory_rows": ["recorder"]}
    baseline["rows"][0]["memory"] = {"polyfuse_mib": 1.0, "peer_mib": 1.0, "ratio": 1.0}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))
    out = tmp_path / "results"
    code = main(["bench", "peers", "--multibench", str(tmp_path), "--against", str(path), "--repeats", "1",
                 "--warmup", "0", "--output-dir", str(out), "--quiet"])
    payload = json.loads((out / "peers.json").read_text())
    assert [row["name"] for row in payload["rows"]] == ["recorder"]
    assert payload["settings"]["threads"] == [1] and payload["settings"]["modes"] == ["train"]
    assert payload["settings"]["memory_rows"] == ["recorder"] and payload["rows"][0]["memory"]["ratio"] == 1.0
    assert code == 0  # ratios of about 1 against 50: better; the memory ratio is a count: the same
    assert "recorder b5  t1 train fwd+bwd  50.00 -> " in capsys.readouterr().out
    assert f"--against {path}" in (out / "peers.md").read_text()
