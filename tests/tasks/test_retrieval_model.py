"""Retrieval heads: mean of experts by hand, absent experts never read."""

import pytest
import torch

from polyfuse.tasks.retrieval import ExpertVideoEncoder


def _batch():
    g = torch.Generator().manual_seed(0)
    features = [torch.randn(3, 4, 5, generator=g), torch.randn(3, 2, 6, generator=g)]
    masks = [torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool(), torch.ones(3, 2, dtype=torch.bool)]
    present = torch.tensor([[True, True], [True, False], [False, True]])
    return features, masks, present


def test_mean_of_experts_by_hand():
    torch.manual_seed(0)
    encoder = ExpertVideoEncoder([5, 6], 7, fusion="mean")
    features, masks, present = _batch()
    out = encoder(features, masks, present)
    a = encoder.projections[0](features[0][0, :2].mean(0))
    b = encoder.projections[1](features[1][0].mean(0))
    expected0 = torch.nn.functional.normalize((a + b) / 2, dim=0)
    expected1 = torch.nn.functional.normalize(encoder.projections[0](features[0][1].mean(0)), dim=0)
    expected2 = torch.nn.functional.normalize(encoder.projections[1](features[1][2].mean(0)), dim=0)
    assert torch.allclose(out, torch.stack([expected0, expected1, expected2]), atol=1e-6)


@pytest.mark.parametrize("fusion", ["man", "concat", "mean"])
def test_absent_expert_features_are_never_read(fusion):
    torch.manual_seed(0)
    encoder = ExpertVideoEncoder([5, 6], 7, fusion=fusion, hidden_dim=8)
    features, masks, present = _batch()
    out = encoder(features, masks, present)
    changed = [x.clone() for x in features]
    changed[1][1] = 1e3  # video 1 lacks expert 1
    changed[0][2] = -1e3  # video 2 lacks expert 0
    changed[0][0, 2:] = 7.0  # padded steps of video 0
    assert torch.allclose(encoder(changed, masks, present), out, atol=1e-6)
    changed[1][0] = 5.0  # a present expert: the output must move
    assert not torch.allclose(encoder(changed, masks, present)[0], out[0], atol=1e-3)


def test_video_without_any_expert_is_refused():
    encoder = ExpertVideoEncoder([5, 6], 7, fusion="mean")
    features, masks, _ = _batch()
    with pytest.raises(ValueError, match="no expert"):
        encoder(features, masks, torch.zeros(3, 2, dtype=torch.bool))
