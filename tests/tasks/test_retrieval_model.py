"""Retrieval heads: mean of experts by hand, absent experts never read."""

import pytest
import torch

from polyfuse.cli.retrieval import FUSIONS
from polyfuse.tasks.retrieval import VIDEO_FUSIONS, ExpertVideoEncoder, RetrievalModel


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


@pytest.mark.parametrize("fusion", ["man", "concat", "mean", "gating"])
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


def _geu(unit, x):
    """Miech et al.'s gated embedding unit, written out."""
    z = x @ unit.linear.weight.T + unit.linear.bias
    y = z * torch.sigmoid(z @ unit.gate.weight.T + unit.gate.bias)
    return y / y.norm()


def test_collaborative_gating_by_hand():
    """Collaborative experts (section 3), sample by sample and expert by expert: the
    video vector, the text vector and their dot product as CE's mixture of cosines."""
    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating").eval()
    features, masks, present = _batch()
    videos = model.embed_videos(features, masks, present)
    gating = model.video.gating
    sentences = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    texts = model.embed_texts(sentences)
    assert videos.shape == (3, 8) and texts.shape == (2, 8)
    for b in range(3):
        phi = [gating.projections[i](features[i][b][masks[i][b]].mean(0)) for i in range(2)]
        for i in range(2):
            expected = torch.zeros(4)
            if present[b, i]:
                total = torch.zeros(4)
                for j in range(2):
                    if j != i and present[b, j]:
                        total = total + gating.g(torch.cat([phi[i], phi[j]]))
                expected = _geu(gating.units[i], phi[i] * torch.sigmoid(gating.h(total)))
            torch.testing.assert_close(videos[b, 4 * i : 4 * i + 4], expected, rtol=1e-5, atol=1e-6)
    head = model.text_head
    for t in range(2):
        weights = torch.softmax(head.mixture(sentences[t]), dim=0)
        units = [_geu(head.units[i], sentences[t]) for i in range(2)]
        torch.testing.assert_close(texts[t], torch.cat([weights[i] * units[i] for i in range(2)]), rtol=1e-5, atol=1e-6)
        for b in range(3):
            score = sum(
                weights[i] * float(present[b, i]) * torch.dot(units[i], videos[b, 4 * i : 4 * i + 4]) for i in range(2)
            )
            torch.testing.assert_close(texts[t] @ videos[b], score, rtol=1e-5, atol=1e-6)


def test_gating_modulation_depends_on_the_other_expert():
    """T_i sums g over the *other* experts: changing expert 1 moves expert 0's embedding
    of a video that has both, and not of a video that lacks expert 1."""
    torch.manual_seed(0)
    encoder = ExpertVideoEncoder([5, 6], 16, fusion="gating")
    features, masks, present = _batch()
    out = encoder(features, masks, present)
    changed = [x.clone() for x in features]
    changed[1] = changed[1] + 3.0
    moved = encoder(changed, masks, present)
    assert not torch.allclose(moved[0, :16], out[0, :16], atol=1e-4)  # video 0 has both experts
    torch.testing.assert_close(moved[1], out[1])  # video 1 lacks expert 1


def test_cli_fusion_choices_are_the_model_choices():
    assert FUSIONS == VIDEO_FUSIONS
