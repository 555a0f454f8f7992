"""Chimera retrieval: pair scores agree with the Chimera module's own H_M; ablations by hand."""

import pytest
import torch

from polyfuse.functional.pooling import masked_mean
from polyfuse.nn.chimera import Chimera
from polyfuse.nn.models.chimera import ChimeraRetrievalModel


def _inputs():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 4, 8, generator=g)
    tmask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    steps = torch.randn(2, 5, 6, generator=g)
    vmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
    return tokens, tmask, steps, vmask


def test_pair_scores_equal_chimera_forward():
    torch.manual_seed(0)
    model = ChimeraRetrievalModel(8, 6, num_topics=3, hyperbolic_dim=4).eval()
    reference = Chimera(8, num_topics=3, hyperbolic_dim=4).eval()
    reference.text_topic.load_state_dict(model.text_topic.state_dict())
    reference.image_topic.load_state_dict(model.image_topic.state_dict())
    reference.hyperbolic.load_state_dict(model.hyperbolic.state_dict())
    reference.matching.load_state_dict(model.matching.state_dict())
    tokens, tmask, steps, vmask = _inputs()
    with torch.no_grad():
        scores = model.score_matrix(model.texts(tokens, tmask), model.videos(steps, vmask))
        for t in range(3):
            for v in range(2):
                image = model.video_projection(steps[v : v + 1])
                out = reference(tokens[t : t + 1], image, tmask[t : t + 1], vmask[v : v + 1])
                # H_M's mean over the caption's real tokens times its mean over the video's real steps
                text_mean = masked_mean(out.hidden[:, :4], tmask[t : t + 1])
                video_mean = masked_mean(out.hidden[:, 4:], vmask[v : v + 1])
                expected = model.score_head(text_mean * video_mean).squeeze()
                assert torch.allclose(scores[t, v], expected, atol=1e-5)


def test_without_topic_and_hyperbolic_layers_by_hand():
    torch.manual_seed(0)
    model = ChimeraRetrievalModel(8, 6, num_topics=0, hyperbolic_dim=0).eval()
    tokens, tmask, steps, vmask = _inputs()
    with torch.no_grad():
        scores = model.score_matrix(model.texts(tokens, tmask), model.videos(steps, vmask))
        wt, wv = model.matching.topic_weight, model.matching.visual_weight
        text = tokens[1, :2]
        image = model.video_projection(steps[0])
        # Eq. 9 with H_h = H_T = H_L: text rows (1 - wt) h + wt (1 - wv) h, image rows (1 - wt) h + wt wv h
        text_part = ((1 - wt) * text + wt * (1 - wv) * text).mean(0)
        image_part = ((1 - wt) * image + wt * wv * image).mean(0)
        expected = (model.score_head.weight[0] * text_part * image_part).sum()
    assert torch.allclose(scores[1, 0], expected.squeeze(), atol=1e-5)
    # not additive (a(caption) + b(video) would give equal differences): the caption changes the
    # gap between the two videos, so it can change their order
    gaps = scores[:, 0] - scores[:, 1]
    assert (gaps.max() - gaps.min()).abs() > 1e-3


def _lm_setup(variant):
    torch.manual_seed(0)
    from polyfuse.nn.chimera import TiedMaskedLMHead

    model = ChimeraRetrievalModel(8, 6, num_topics=3, topic_variant=variant, hyperbolic_dim=0)
    embeddings = torch.nn.Parameter(torch.randn(11, 8))
    head = TiedMaskedLMHead(embeddings)
    with torch.no_grad():
        head.bias.normal_()
        if variant == "affine":
            model.text_topic.topic_weights.normal_(0.0, 0.5)  # topics far apart
            model.text_topic.topic_prior.weight.normal_(0.0, 1.0)
    tokens, tmask, _, _ = _inputs()
    ids = torch.randint(0, 11, tmask.shape, generator=torch.Generator().manual_seed(2))
    masked = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]]).bool()
    return model, head, tokens, tmask, ids, masked


def test_topic_lm_loss_of_identity_topics_is_the_masked_lm_cross_entropy():
    """With every topic the identity (residual variant), Eq. 3's mixture is the head's own
    word distribution: L_T = F.cross_entropy over the explicitly gathered masked positions."""
    model, head, tokens, tmask, ids, masked = _lm_setup("residual")
    text = model.texts(tokens, tmask)
    positions = masked.nonzero().tolist()
    logits = torch.stack([head(tokens[b, n]) for b, n in positions])
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([int(ids[b, n]) for b, n in positions]))
    torch.testing.assert_close(model.topic_lm_loss(text, ids, masked, head), expected)


def test_topic_lm_loss_equals_eq3_by_hand_in_float64():
    """Affine topics: -mean_t log sum_z softmax(LayerNorm(h) W_Z)_z softmax(head(T_z h))_x, computed
    position by position and topic by topic in float64 from the parameters."""
    model, head, tokens, tmask, ids, masked = _lm_setup("affine")
    loss = model.topic_lm_loss(model.texts(tokens, tmask), ids, masked, head)
    layer = model.text_topic
    total = []
    for b, n in masked.nonzero().tolist():
        h = tokens[b, n].double()
        prior = torch.softmax(torch.nn.functional.layer_norm(h, (8,), layer.norm.weight.double(),
                                                             layer.norm.bias.double(), 1e-5)
                              @ layer.topic_prior.weight.double().T, 0)
        states = [h] + [h @ layer.topic_weights[z].double() + layer.topic_biases[z].double() for z in range(2)]
        likelihood = 0.0
        for z, state in enumerate(states):
            transformed = torch.nn.functional.layer_norm(
                torch.nn.functional.gelu(state @ head.dense.weight.double().T + head.dense.bias.double()), (8,),
                head.norm.weight.double(), head.norm.bias.double(), 1e-12)
            words = torch.softmax(transformed @ head.decoder_weight.double().T + head.bias.double(), 0)
            likelihood = likelihood + prior[z] * words[ids[b, n]]
        total.append(-torch.log(likelihood))
    expected = torch.stack(total).mean()
    assert abs(loss.item() - expected.item()) < 1e-5
    loss.backward()  # L_T trains the topic prior and the topic transforms, not the frozen embeddings' owner
    assert layer.topic_prior.weight.grad.abs().sum() > 0 and layer.topic_weights.grad.abs().sum() > 0


def test_word_logits_are_computed_at_the_masked_positions_only():
    model, head, tokens, tmask, ids, masked = _lm_setup("affine")
    seen = []
    handle = head.register_forward_hook(lambda module, inputs, output: seen.append(tuple(output.shape)))
    model.topic_lm_loss(model.texts(tokens, tmask), ids, masked, head)
    handle.remove()
    assert seen == [(int(masked.sum()), 3, 11)]  # (M, Z, V): 5 masked tokens, never (B, N, Z, V) = 12 positions
    with pytest.raises(ValueError, match="padded position"):
        model.topic_lm_loss(model.texts(tokens, tmask), ids, masked | ~tmask, head)
    nothing = model.topic_lm_loss(model.texts(tokens, tmask), ids, torch.zeros_like(masked), head)
    assert float(nothing.detach()) == 0.0


def test_tied_head_shares_the_embedding_storage_and_is_bert_s_head():
    from polyfuse.nn.chimera import TiedMaskedLMHead

    embeddings = torch.nn.Parameter(torch.randn(11, 8))
    head = TiedMaskedLMHead(embeddings)
    assert head.decoder_weight is embeddings and head.decoder_weight.data_ptr() == embeddings.data_ptr()
    assert "decoder_weight" not in head.own_state() and sum(p.numel() for p in head.own_parameters()) == 64 + 8 + 16 + 11
    h = torch.randn(2, 8)
    with torch.no_grad():
        embeddings[3] += 1.0  # an edit of the encoder's embedding is the head's
        expected = torch.nn.functional.layer_norm(torch.nn.functional.gelu(h @ head.dense.weight.T + head.dense.bias),
                                                  (8,), head.norm.weight, head.norm.bias, 1e-12) @ embeddings.T
        torch.testing.assert_close(head(h), expected + head.bias)


def test_dropped_regions_are_excluded_from_the_scores():
    """A video whose steps 1 and 3 are dropped from its mask scores as the video without them."""
    from polyfuse.functional.chimera_masking import drop_regions

    torch.manual_seed(0)
    model = ChimeraRetrievalModel(8, 6, num_topics=3, hyperbolic_dim=4).eval()
    tokens, tmask, steps, vmask = _inputs()
    dropped = drop_regions(vmask[:1], 0.4, torch.Generator().manual_seed(0))  # 2 of 5 steps
    kept = dropped[0].nonzero().squeeze(1)
    assert kept.numel() == 3
    with torch.no_grad():
        text = model.texts(tokens, tmask)
        masked = model.score_matrix(text, model.videos(steps[:1], dropped))
        removed = model.score_matrix(text, model.videos(steps[:1, kept], torch.ones(1, 3, dtype=torch.bool)))
    torch.testing.assert_close(masked, removed, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(masked, model.score_matrix(text, model.videos(steps[:1], vmask[:1])), atol=1e-4)
