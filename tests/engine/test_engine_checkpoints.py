"""Safetensors checkpoints: exact round trips of nested state, refusal of anything
that would need pickle, clear errors for wrong or broken files."""

import json
import math

import pytest
import torch
from safetensors import safe_open

from polyfuse.engine.checkpoints import decode, encode, read_checkpoint, write_checkpoint


def nested_state():
    return {
        "epoch": 3,
        "state_dict": {"layer.weight": torch.randn(3, 4), "layer.bias": torch.zeros(4, dtype=torch.float64)},
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(2, dtype=torch.bfloat16)}},
                "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None}],
            }
        ],
        "callbacks": {"Checkpoint{'monitor': 'val/mae'}": {"best_k_models": {"/runs/a/best.safetensors": torch.tensor(0.5)}}},
        "flags": [True, None, "text", math.inf, {"nested": (1, (2, 3))}],
        "counts": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, ::2],  # not contiguous
    }


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_round_trip_is_exact(tmp_path):
    state = nested_state()
    write_checkpoint(state, tmp_path / "c.safetensors")
    assert_same(read_checkpoint(tmp_path / "c.safetensors"), state)
    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        metadata = handle.metadata()
    assert "state_dict/layer.weight" in names and "optimizer_states/0/state/0/exp_avg" in names
    assert json.loads(metadata["content"])["epoch"] == 3


def test_objects_that_need_pickle_are_refused():
    with pytest.raises(TypeError, match=r"cannot store a object at 'hyper_parameters/model'"):
        encode({"hyper_parameters": {"model": object()}}, "", {})
    with pytest.raises(TypeError, match="cannot store the key"):
        encode({object(): 1}, "", {})


def test_decode_inverts_encode_for_plain_values():
    tensors = {}
    value = {1: "a", "b": (None, [1.5, {"c": torch.ones(1)}])}
    assert_same(decode(encode(value, "", tensors), tensors), value)


def test_wrong_or_broken_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "none.safetensors")
    pickled = tmp_path / "model.ckpt"
    torch.save({"a": 1}, pickled)
    with pytest.raises(ValueError, match="never loaded, as unpickling can run arbitrary code"):
        read_checkpoint(pickled)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ValueError, match="cannot read the checkpoint"):
        read_checkpoint(garbage)
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.ones(2)}, str(foreign))
    with pytest.raises(ValueError, match="not a polyfuse checkpoint"):
        read_checkpoint(foreign)
    good = tmp_path / "good.safetensors"
    write_checkpoint(nested_state(), good)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(ValueError, match="cannot read the checkpoint"):
        read_checkpoint(truncated)
