"""``polyfuse bench peers``: weight mappings, skipped and refused rows, the CLI.

The fake peer below is a temporary folder laid out like MultiBench (``fusions/
common_fusions.py``, ``unimodals/common_models.py``) whose modules are written here
from the TFN and LMF papers with explicit loops over the entries, in MultiBench's
layout (the constant 1 first); polyfuse must match them through the weight mapping.
The real peers are read from /work/peers/{MAN,ban-vqa,MultiBench} (or
POLYFUSE_PEERS), made with the search tools' ``fetch``; those tests skip without them.
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

from polyfuse.bench.peer_rows import ROWS, tfn_permutation
from polyfuse.bench.peers import format_table, peer_commit, run_peers
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
        ratio = rows[name]["timings"]["1"]["forward"]["ratio"]
        assert ratio["rounds"] == 2 and ratio["median"] > 0
    # TFN at batch 3 on both sides: the encoders 3 -> 2, 4 -> 3, 2 -> 1 (2 x 3 x 20 FLOPs), then
    # (2+1)(3+1)(1+1) = 24 fused features through 24 -> 5 -> 2 (2 x 3 x (120 + 10)): 900 each.
    assert rows["tfn"]["forward_flops"] == {"polyfuse": 900, "peer": 900}
    assert "| 1 |" in format_table(payload) and "MFLOP polyfuse / peer" in format_table(payload)
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

_PEERS = Path(os.environ.get("POLYFUSE_PEERS", "/work/peers"))
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
    folder = {"man": "MAN", "ban_vqa": "ban-vqa", "multibench": "MultiBench"}[spec.peer]
    if not (_PEERS / folder).is_dir():
        pytest.skip(f"no checkout at {_PEERS / folder}")
    specs = {name: dataclasses.replace(spec, sizes=_SMALL[name])}
    payload = run_peers({spec.peer: _PEERS / folder}, rows=[name], specs=specs, tolerance=1e-5, **_QUICK)
    (row,) = payload["rows"]
    assert row["status"] == "timed", row
    assert row["max_abs_difference"] <= 1e-5 * max(1.0, row["max_abs_peer_output"])
    assert row["max_abs_peer_output"] > 1e-2


def test_real_man_as_published_differs_but_matches_at_one_step():
    if not (_PEERS / "MAN").is_dir():
        pytest.skip(f"no checkout at {_PEERS / 'MAN'}")
    published = ROWS["man_published"]
    specs = {"long": dataclasses.replace(published, name="long", sizes=_SMALL["man_published"]),
             "one_step": dataclasses.replace(published, name="one_step", sizes={**_SMALL["man_published"], "length": 1})}
    payload = run_peers({"man": _PEERS / "MAN"}, specs=specs, **_QUICK)
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
    assert "| tfn | 1 | 3 |" in format_table(payload)


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

    if not (_PEERS / "ban-vqa").is_dir():
        pytest.skip(f"no checkout at {_PEERS / 'ban-vqa'}")
    source = (_PEERS / "ban-vqa" / "attention.py").read_text()
    spec = ROWS["ban_small"]
    with built_on_cpu():
        pair = spec.build(_PEERS / "ban-vqa", _SMALL["ban_small"], 0, torch.device("cuda"))
    assert pair.patches == [describe_patch(patch) for patch in CUDA_PATCHES["ban_vqa"]]
    assert pair.patches == ["attention.py: `logits.view(-1, self.glimpse, v_num * q_num)` -> "
                            "`logits.reshape(-1, self.glimpse, v_num * q_num)`"]
    for module in pair.modules:
        module.eval()
    with torch.no_grad():
        torch.testing.assert_close(pair.ours(pair.inputs), pair.theirs(pair.inputs), rtol=1e-5, atol=1e-5)
    assert (_PEERS / "ban-vqa" / "attention.py").read_text() == source
