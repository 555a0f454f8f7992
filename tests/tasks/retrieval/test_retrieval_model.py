"""Retrieval heads: mean of experts by hand, absent experts never read."""

import pytest
import torch

from polyfuse.nn.models.retrieval import VIDEO_FUSIONS, ExpertVideoEncoder, RetrievalModel


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


@pytest.mark.parametrize("fusion", VIDEO_FUSIONS)
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
                        total = total + gating.pair_relation(torch.cat([phi[i], phi[j]]))
                expected = _geu(gating.units[i], phi[i] * torch.sigmoid(gating.attention(total)))
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


# The keys of collaborative gating's g and h MLPs before they were named (polyfuse 0.3.x and
# earlier), which 0.4.0 no longer renames on load.
OLD_GATING_KEYS = {
    f"video.gating.{old}.{layer}.{kind}": f"video.gating.{new}.{layer}.{kind}"
    for old, new in (("g", "pair_relation"), ("h", "attention"))
    for layer in (0, 2)
    for kind in ("weight", "bias")
}


def test_a_state_dict_of_the_old_gating_layout_is_refused():
    trained = RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating", hidden_dim=8)
    renamed = {new: old for old, new in OLD_GATING_KEYS.items()}
    old_layout = {renamed.get(key, key): value for key, value in trained.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: .*video\.gating\.g\.0\.weight"):
        RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating", hidden_dim=8).load_state_dict(old_layout)


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


def _layer_norm(x, norm):
    """LayerNorm written out: (x - mean) / sqrt(var + eps) * weight + bias (biased variance)."""
    centred = x - x.mean()
    return centred / torch.sqrt((centred**2).mean() + norm.eps) * norm.weight + norm.bias


def _man_vector(encoder, features, masks, present, b, unit=True):
    """The MAN branch of video b: MAN's fused vector over the experts (an absent expert as
    its absent step), layer-normalised, the output map, L2-normalised (when ``unit``)."""
    inputs, input_masks = [], []
    for j in range(len(features)):
        here = bool(present[b, j])
        inputs.append(torch.cat((encoder.absent[j].view(1, 1, -1), features[j][b : b + 1]), dim=1))
        real = masks[j][b : b + 1] & here
        input_masks.append(torch.cat((torch.tensor([[not here]]), real), dim=1))
    fused = encoder.fusion(inputs, input_masks)[0]  # the MAN module itself is tested in tests/nn
    norm, linear = encoder.fused_output
    out = _layer_norm(fused, norm) @ linear.weight.T + linear.bias
    return out / out.norm() if unit else out


def test_gating_plus_man_by_hand():
    """MAN appendix H.2: CE's representation concatenated with MAN's; on the text side
    MAN's vector is one more expert of CE's mixture: score = sum_i w_i present_i cos_i
    + w_MAN cos_MAN."""
    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating+man", hidden_dim=8).eval()
    features, masks, present = _batch()
    videos = model.embed_videos(features, masks, present)
    sentences = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    texts = model.embed_texts(sentences)
    assert videos.shape == (3, 12) and texts.shape == (2, 12)
    ce = RetrievalModel(5, [5, 6], embed_dim=4, fusion="gating")
    ce.video.gating.load_state_dict(model.video.gating.state_dict())
    torch.testing.assert_close(videos[:, :8], ce.embed_videos(features, masks, present))  # CE's blocks
    head = model.text_head
    for b in range(3):
        man = _man_vector(model.video, features, masks, present, b)
        torch.testing.assert_close(videos[b, 8:], man, rtol=1e-5, atol=1e-6)
        for t in range(2):
            weights = torch.softmax(head.mixture(sentences[t]), dim=0)  # over 3: two experts and MAN
            units = [_geu(head.units[i], sentences[t]) for i in range(3)]
            score = sum(
                weights[i] * float(present[b, i]) * torch.dot(units[i], videos[b, 4 * i : 4 * i + 4]) for i in range(2)
            ) + weights[2] * torch.dot(units[2], man)
            torch.testing.assert_close(texts[t] @ videos[b], score, rtol=1e-5, atol=1e-6)


def _mean_vector(model, features, masks, present, b):
    """The mean-of-experts branch of video b, written out: the masked means projected,
    averaged over the experts the video has, L2-normalised."""
    pooled = [model.video.projections[j](features[j][b][masks[j][b]].mean(0)) for j in range(2) if present[b, j]]
    mean = sum(pooled) / len(pooled)
    return mean / mean.norm()


def test_mean_plus_man_equal_weights_by_hand():
    """``man_zero_init=False`` (the layout before): the mean of experts and MAN, each a
    unit vector, weighed equally: score = (cos_mean + cos_MAN) / 2."""
    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8, man_zero_init=False).eval()
    features, masks, present = _batch()
    videos = model.embed_videos(features, masks, present)
    sentences = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    texts = model.embed_texts(sentences)
    for b in range(3):
        mean = _mean_vector(model, features, masks, present, b)
        man = _man_vector(model.video, features, masks, present, b)
        for t in range(2):
            text = sentences[t] @ model.text_head.weight.T + model.text_head.bias
            text_mean, text_man = text[:4] / text[:4].norm(), text[4:] / text[4:].norm()
            expected = (torch.dot(text_mean, mean) + torch.dot(text_man, man)) / 2
            torch.testing.assert_close(texts[t] @ videos[b], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(videos.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(texts.norm(dim=1), torch.ones(2))


def test_mean_plus_man_starts_as_the_mean_of_experts():
    """The default: MAN's branch starts at zero (its output map zero-initialised), so at
    initialisation every score is the mean of experts' cosine cos(A t, mean), written out,
    and equals the score of a ``mean`` model with the same projections and text map."""
    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8).eval()
    assert model.video.man_zero_init
    features, masks, present = _batch()
    sentences = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    videos, texts = model.embed_videos(features, masks, present), model.embed_texts(sentences)
    assert videos.shape == (3, 8) and texts.shape == (2, 8)
    assert torch.equal(videos[:, 4:], torch.zeros(3, 4))  # MAN's half is exactly zero
    mean_model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean").eval()
    mean_model.video.projections.load_state_dict(model.video.projections.state_dict())
    mean_model.text_head.weight.data.copy_(model.text_head.weight[:4])
    mean_model.text_head.bias.data.copy_(model.text_head.bias[:4])
    torch.testing.assert_close(texts @ videos.T, mean_model.embed_texts(sentences)
                               @ mean_model.embed_videos(features, masks, present).T)
    for b in range(3):
        mean = _mean_vector(model, features, masks, present, b)
        for t in range(2):
            text = sentences[t] @ model.text_head.weight[:4].T + model.text_head.bias[:4]
            torch.testing.assert_close(texts[t] @ videos[b], torch.dot(text / text.norm(), mean))


def test_mean_plus_man_zero_init_learns_its_share():
    """Zero-initialised, MAN's output map still gets a gradient (ReZero): one optimizer step
    on the ranking loss makes MAN's half non-zero, and the score is then cos(A t, mean) +
    <unit(B t), W_o LN(MAN(v)) + b_o>, written out."""
    from polyfuse.functional.contrastive import max_margin_ranking_loss

    torch.manual_seed(0)
    model = RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean+man", hidden_dim=8)
    features, masks, present = _batch()
    present = torch.ones(3, 2, dtype=torch.bool)
    sentences = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scores = model.embed_texts(sentences) @ model.embed_videos(features, masks, present).T
    max_margin_ranking_loss(scores, torch.eye(3, dtype=torch.bool), margin=0.2).backward()
    assert float(model.video.fused_output[1].weight.grad.abs().max()) > 1e-3
    optimizer.step()
    model.eval()
    videos, texts = model.embed_videos(features, masks, present), model.embed_texts(sentences)
    assert float(videos[:, 4:].detach().abs().max()) > 1e-3
    for b in range(3):
        mean = _mean_vector(model, features, masks, present, b)
        man = _man_vector(model.video, features, masks, present, b, unit=False)
        for t in range(3):
            text = sentences[t] @ model.text_head.weight.T + model.text_head.bias
            text_mean, text_man = text[:4] / text[:4].norm(), text[4:] / text[4:].norm()
            expected = torch.dot(text_mean, mean) + torch.dot(text_man, man)
            torch.testing.assert_close(texts[t] @ videos[b], expected, rtol=1e-5, atol=1e-6)


def test_man_zero_init_is_refused_where_it_does_not_apply():
    for fusion in ("man", "gating+man", "mean"):
        with pytest.raises(ValueError, match="mean\\+man only"):
            ExpertVideoEncoder([5, 6], 7, fusion=fusion, hidden_dim=8, man_zero_init=True)
        assert not ExpertVideoEncoder([5, 6], 7, fusion=fusion, hidden_dim=8).man_zero_init
    with pytest.raises(ValueError, match="needs man_layer_norm"):
        ExpertVideoEncoder([5, 6], 7, fusion="mean+man", hidden_dim=8, man_layer_norm=False, man_zero_init=True)
    # the default follows the layer norm: without it, the two unit vectors weighed equally
    assert not ExpertVideoEncoder([5, 6], 7, fusion="mean+man", hidden_dim=8, man_layer_norm=False).man_zero_init


def _vgg_like_experts(videos=12, steps=20, dim=256):
    """Appearance: non-negative (ReLU) steps around a mean shared by every video, as VGG's;
    motion: differences of consecutive appearance steps (near zero mean), as MSVD's."""
    g = torch.Generator().manual_seed(0)
    shared = torch.rand(dim, generator=g) * 2
    per_video = torch.randn(videos, 1, dim, generator=g)
    appearance = torch.relu(shared + per_video + 0.5 * torch.randn(videos, steps, dim, generator=g))
    motion = appearance[:, 1:] - appearance[:, :-1]
    features = [appearance, motion]
    masks = [torch.ones(videos, steps, dtype=torch.bool), torch.ones(videos, steps - 1, dtype=torch.bool)]
    return features, masks, torch.ones(videos, 2, dtype=torch.bool)


def _mean_pairwise_cosine(vectors):
    cosines = vectors @ vectors.T
    return float(cosines[~torch.eye(len(vectors), dtype=torch.bool)].mean())


def test_man_video_vectors_are_not_collapsed_at_initialisation():
    """MAN's value is a product of projected steps of both experts, about ten times
    smaller than an output bias at initialisation: without the layer norm every video
    got the bias's direction (pairwise cosine 0.99 on MSVD, near 1 here), and the
    ranking started below chance. With it, the videos are as spread as the mean of
    experts spreads them."""
    features, masks, present = _vgg_like_experts()
    spread = {}
    for fusion, layer_norm in (("man", True), ("man", False), ("mean", True)):
        torch.manual_seed(0)
        encoder = ExpertVideoEncoder([256, 256], 32, fusion=fusion, man_layer_norm=layer_norm).eval()
        with torch.no_grad():
            spread[fusion, layer_norm] = _mean_pairwise_cosine(encoder(features, masks, present))
    assert spread["man", False] > 0.85  # the collapse the layer norm removes
    assert spread["man", True] < 0.5
    assert spread["man", True] < spread["mean", True]


def test_man_output_ignores_the_scale_of_the_fused_vector():
    """Scaling MAN's value maps by 10 multiplies its (bilinear) fused vector by 100; the
    layer norm makes the video vector independent of that scale (up to its epsilon),
    where without it the output bias's share, and so the direction, changes."""
    features, masks, present = _batch()
    for layer_norm, moves in ((True, False), (False, True)):
        torch.manual_seed(0)
        encoder = ExpertVideoEncoder([5, 6], 7, fusion="mean+man", hidden_dim=8, man_layer_norm=layer_norm,
                                     man_zero_init=False).eval()
        with torch.no_grad():
            before = encoder(features, masks, present)
            for projection in encoder.fusion.layers[0].projections:
                projection.weight[:8] *= 10  # the value rows U'_j (the first hidden_dim outputs)
                projection.bias[:8] *= 10
            change = float((encoder(features, masks, present) - before)[:, 7:].abs().max())  # MAN's half
        assert (change > 0.1) if moves else (change < 1e-3)


def test_man_layer_norm_by_default_only_beside_an_additive_branch():
    for fusion, expected in (("man", False), ("gating+man", True), ("mean+man", True)):
        assert ExpertVideoEncoder([5, 6], 7, fusion=fusion, hidden_dim=8).man_layer_norm is expected
        assert ExpertVideoEncoder([5, 6], 7, fusion=fusion, hidden_dim=8, man_layer_norm=not expected).man_layer_norm is (not expected)
