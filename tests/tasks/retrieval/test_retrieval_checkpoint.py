"""Checkpoints of an older ``polyfuse retrieval train`` (``seed<N>.safetensors``, settings as
a dict) across the MAN layer-norm and zero-start changes: old layouts still load, through
:func:`polyfuse.tasks.retrieval.spec.legacy_checkpoint` into the task type's module."""

import torch

from polyfuse.engine.checkpoints import read_checkpoint, write_checkpoint
from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.tasks.registry import task_spec
from polyfuse.tasks.retrieval.spec import legacy_checkpoint

# the settings an older polyfuse wrote (its RetrievalSettings dataclass, as a dict)
_OLD = {"epochs": 30, "batch_size": 32, "lr": 1e-3, "weight_decay": 1e-4, "loss": "margin", "margin": 0.2,
        "temperature": 0.05, "chunk_size": 1024, "fusion_options": {}, "text_lr": None, "precision": "32-true",
        "man_layer_norm": None, "man_zero_init": None, "man_lr": None}


def RetrievalSettings(**settings):
    return {**_OLD, **settings}


def asdict(settings):
    return dict(settings)


def _videos():
    g = torch.Generator().manual_seed(0)
    features = [torch.randn(3, 4, 5, generator=g), torch.randn(3, 2, 6, generator=g)]
    masks = [torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)]
    return features, masks, torch.ones(3, 2, dtype=torch.bool)


def _round_trip(tmp_path, model, settings: dict):
    write_checkpoint({"state": model.state_dict(), "settings": settings, "text_dim": 5, "expert_dims": [5, 6]},
                     tmp_path / "seed0.safetensors")
    state, extras = legacy_checkpoint(read_checkpoint(tmp_path / "seed0.safetensors"))
    loaded = task_spec("retrieval").load_module(state, extras, None).model
    torch.testing.assert_close(loaded.embed_videos(*_videos()), model.embed_videos(*_videos()))
    return loaded


def test_a_man_checkpoint_saved_before_the_layer_norm_loads_as_it_was(tmp_path):
    torch.manual_seed(0)
    old = RetrievalModel(5, [5, 6], embed_dim=4, fusion="man", hidden_dim=8).eval()  # MAN alone: no norm
    settings = asdict(RetrievalSettings(fusion="man", embed_dim=4, hidden_dim=8))
    del settings["man_layer_norm"]  # the settings of a checkpoint of an earlier polyfuse
    assert "video.fusion.output.weight" in old.state_dict()
    assert not _round_trip(tmp_path, old, settings).video.man_layer_norm


def test_a_new_man_checkpoint_keeps_its_layer_norm(tmp_path):
    torch.manual_seed(0)
    new = RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating+man", hidden_dim=8).eval()
    settings = asdict(RetrievalSettings(fusion="gating+man", embed_dim=4, hidden_dim=8))
    assert "video.fused_output.0.weight" in new.state_dict()  # the LayerNorm, on beside CE by default
    assert _round_trip(tmp_path, new, settings).video.man_layer_norm


def test_a_mean_plus_man_checkpoint_saved_before_zero_init_loads_as_it_was(tmp_path):
    """Same keys and shapes in both layouts: a checkpoint whose settings lack
    ``man_zero_init`` (an earlier polyfuse) must load as the two unit vectors weighed
    equally, never as the zero-init layout (which would read its weights otherwise)."""
    torch.manual_seed(0)
    old = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8, man_zero_init=False).eval()
    settings = asdict(RetrievalSettings(fusion="mean+man", embed_dim=4, hidden_dim=8))
    del settings["man_zero_init"]
    loaded = _round_trip(tmp_path, old, settings)
    assert not loaded.video.man_zero_init
    torch.testing.assert_close(loaded.embed_videos(*_videos()).norm(dim=1), torch.ones(3))


def test_a_zero_init_mean_plus_man_checkpoint_keeps_its_layout(tmp_path):
    torch.manual_seed(0)
    new = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8).eval()
    with torch.no_grad():  # a trained MAN branch: its output map no longer zero
        new.video.fused_output[1].weight.normal_()
    settings = {**asdict(RetrievalSettings(fusion="mean+man", embed_dim=4, hidden_dim=8)), "man_zero_init": True}
    assert _round_trip(tmp_path, new, settings).video.man_zero_init
