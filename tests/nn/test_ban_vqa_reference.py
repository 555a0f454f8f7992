"""BanVQA loaded by interop.load_ban_vqa against the reference code itself.

The modules of github.com/jnhwkim/ban-vqa (base_model, attention, bc, fc, counting,
language_model, classifier) are read unchanged, at HEAD, from a git directory of the
repository that the environment variable ``POLYFUSE_BAN_VQA_GIT`` names (a clone's
``.git`` or a bare mirror; docs/TESTING.md): an explicit opt-in, the tests skip when it
is unset and fail when it names no directory. Only
``utils``, which base_model imports for its Flickr model and which needs the
``torch._six`` of old PyTorch, is replaced by an empty module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from polyfuse.interop import load_ban_vqa

_FILES = ["base_model.py", "attention.py", "bc.py", "fc.py", "counting.py", "language_model.py", "classifier.py"]
_VARIABLE = "POLYFUSE_BAN_VQA_GIT"


def _git_dir() -> Path:
    """The git directory of jnhwkim/ban-vqa that ``POLYFUSE_BAN_VQA_GIT`` names; skips the
    test when the variable is unset or git is missing."""
    given = os.environ.get(_VARIABLE)
    if not given:
        pytest.skip(f"{_VARIABLE} is not set: set it to a git directory of github.com/jnhwkim/ban-vqa (docs/TESTING.md)")
    if shutil.which("git") is None:
        pytest.skip(f"git is not installed: {_VARIABLE} names a git directory")
    path = Path(given)
    if not path.is_dir():
        pytest.fail(f"{_VARIABLE}={given} is not a directory")
    return path


@pytest.fixture
def reference(tmp_path, monkeypatch):
    git = _git_dir()
    for name in _FILES:
        text = subprocess.run(
            ["git", f"--git-dir={git}", "show", f"HEAD:{name}"], capture_output=True, check=True, text=True
        ).stdout
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    names = [n[:-3] for n in _FILES] + ["utils"]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.modules["utils"] = types.ModuleType("utils")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import base_model

            yield base_model
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def _reference_model(base_model, *, glimpses, hidden, words, answers, image_dim, seed, op=""):
    torch.manual_seed(seed)
    dataset = types.SimpleNamespace(
        dictionary=types.SimpleNamespace(ntoken=words), v_dim=image_dim, num_ans_candidates=answers
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = base_model.build_ban(dataset, hidden, op=op, gamma=glimpses)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith("counter.f."):
                if int(name.split(".")[2]) < 8:  # f.8 to f.15 are never used: keep them
                    parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.1)
                    parameter[0] = 0.0
            else:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _inputs(batch, objects, image_dim, words, seed):
    generator = torch.Generator().manual_seed(seed + 1)
    v = torch.randn(batch, objects, image_dim, generator=generator)
    v[0, -2:] = 0.0  # padding objects: all-zero rows, masked by the reference
    corners = torch.rand(batch, objects, 2, generator=generator)
    sizes = 0.05 + 0.5 * torch.rand(batch, objects, 2, generator=generator)
    b = torch.cat([corners, corners + sizes, sizes], dim=-1)  # (x1, y1, x2, y2, w, h)
    b[1, 3, :4] = b[1, 5, :4]  # an exact duplicate box
    q = torch.randint(0, words + 1, (batch, 14), generator=generator)  # index `words` is padding
    return v, b, q


# op "c" is ban-vqa's default (main.py --op c, the released BAN-Glove-Counter): a second
# 300-d embedding w_emb.emb_ concatenated after the first, 600 GRU inputs.
@pytest.mark.parametrize(("glimpses", "hidden", "op"), [(2, 16, ""), (4, 8, ""), (2, 8, "c")])
def test_whole_model_matches_reference_forward(reference, glimpses, hidden, op):
    words, answers, image_dim = 23, 9, 12
    model = _reference_model(reference, glimpses=glimpses, hidden=hidden, words=words, answers=answers, image_dim=image_dim, seed=glimpses, op=op)
    assert ("w_emb.emb_.weight" in model.state_dict()) == (op == "c")
    v, b, q = _inputs(3, 13, image_dim, words, seed=glimpses)
    with torch.no_grad():
        expected_logits, expected_attention = model(v, b, q, None)
    ours = load_ban_vqa(model.state_dict()).eval()
    assert ours.counter is not None and ours.glimpses == glimpses
    assert (ours.question.second_embedding is not None) == (op == "c")
    with torch.no_grad():
        logits, attention = ours(q, v, b[:, :, :4])
    torch.testing.assert_close(attention, expected_attention, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    # the counter matters: without it the answer logits change
    ours.counter = None
    with torch.no_grad():
        without, _ = ours(q, v, b[:, :, :4])
    assert (without - expected_logits).abs().max() > 1e-3


def test_left_over_and_changed_keys_are_errors(reference):
    model = _reference_model(reference, glimpses=2, hidden=8, words=5, answers=3, image_dim=6, seed=0)
    state = dict(model.state_dict())
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"extra\.weight"):
        load_ban_vqa(state)
    state = dict(model.state_dict())
    state["counter.f.9.weight"] = state["counter.f.9.weight"] * 2
    with pytest.raises(ValueError, match=r"counter\.f\.9\.weight differs"):
        load_ban_vqa(state)
    state = dict(model.state_dict())
    del state["classifier.main.3.bias"]
    with pytest.raises(ValueError, match=r"classifier\.main\.3\.bias"):
        load_ban_vqa(state)
