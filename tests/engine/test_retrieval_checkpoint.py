"""Retrieval checkpoints across the MAN layer-norm change: old layouts still load."""

from dataclasses import asdict

import torch

from polyfuse.engine.checkpoints import write_checkpoint
from polyfuse.engine.retrieval import RetrievalSettings
from polyfuse.engine.retrieval_runs import load_checkpoint
from polyfuse.nn.models.retrieval import RetrievalModel


def _videos():
    g = torch.Generator().manual_seed(0)
    features = [torch.randn(3, 4, 5, generator=g), torch.randn(3, 2, 6, generator=g)]
    masks = [torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 2, dtype=torch.bool)]
    return features, masks, torch.ones(3, 2, dtype=torch.bool)


def _round_trip(tmp_path, model, settings: dict):
    write_checkpoint({"state": model.state_dict(), "settings": settings, "text_dim": 5, "expert_dims": [5, 6]},
                     tmp_path / "seed0.safetensors")
    loaded, _ = load_checkpoint(tmp_path / "seed0.safetensors")
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
