"""Chimera retrieval: pair scores agree with the Chimera module's own H_M; ablations by hand."""

import pytest
import torch

from polyfuse.functional.pooling import masked_mean
from polyfuse.nn.chimera import Chimera
from polyfuse.tasks.chimera_retrieval import ChimeraRetrievalModel


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
        expected = model.score_head.bias + (model.score_head.weight[0] * text_part * image_part).sum()
    assert torch.allclose(scores[1, 0], expected.squeeze(), atol=1e-5)
    # not additive (a(caption) + b(video) would give equal differences): the caption changes the
    # gap between the two videos, so it can change their order
    gaps = scores[:, 0] - scores[:, 1]
    assert (gaps.max() - gaps.min()).abs() > 1e-3


def _tiny_corpus(tmp_path):
    """8 videos of one expert ('app', 3 steps of 5), two captions each over 6 words, and a
    4-d word-vectors file for them."""
    from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus

    g = torch.Generator().manual_seed(1)
    ids = [f"v{i}" for i in range(8)]
    expert = ExpertFeatures("app", ids, torch.randn(8, 3, 5, generator=g), torch.ones(8, 3, dtype=torch.bool),
                            torch.ones(8, dtype=torch.bool))
    words = ["dog", "cat", "car", "man", "runs", "sits"]
    captions = {v: [f"{words[i % 4]} {words[4 + i % 2]}", f"a {words[(i + 1) % 4]} {words[i % 4]}"]
                for i, v in enumerate(ids)}
    vectors = torch.randn(len(words), 4, generator=g)
    path = tmp_path / "vec.txt"
    path.write_text("\n".join(f"{w} " + " ".join(f"{x:.6f}" for x in row.tolist()) for w, row in zip(words, vectors,
                                                                                                     strict=True)))
    corpus = RetrievalCorpus.build({"app": expert}, captions, ids)
    return corpus.subset(ids[:6]), corpus.subset(ids[6:]), path


def test_train_chimera_frozen_and_with_the_text_encoder_fine_tuned(tmp_path):
    from polyfuse.engine.chimera_retrieval import (
        ChimeraRow,
        encode_tokens,
        evaluate_chimera,
        train_chimera,
    )
    from polyfuse.nn.sentence_encoder import StaticWordEncoder

    train, val, path = _tiny_corpus(tmp_path)
    row = ChimeraRow(num_topics=2, hyperbolic_dim=3)
    frozen = StaticWordEncoder(path)
    tokens = {name: encode_tokens(frozen, part.captions) for name, part in (("train", train), ("val", val))}
    model, history = train_chimera(train, tokens["train"], val, tokens["val"], row, 0, epochs=2, batch_size=3,
                                   expert="app")
    assert [h["epoch"] for h in history] == [0, 1]
    metrics = evaluate_chimera(model, val, *tokens["val"], expert="app")
    assert 1.0 <= metrics["t2v_MeanR"] <= 2.0 and metrics["chance_t2v_R@1"] == 50.0  # 2 validation videos
    tuned = StaticWordEncoder(path, trainable=True)
    before = tuned.embedding.weight.detach().clone()
    train_chimera(train, tokens["train"], val, tokens["val"], row, 0, epochs=2, batch_size=3, expert="app",
                  encoder=tuned, text_lr=0.5)
    assert (tuned.embedding.weight.detach() - before).abs().max() > 1e-3  # the word vectors were trained
    assert torch.equal(frozen.embedding.weight, before)  # a frozen encoder is never touched
    with pytest.raises(ValueError, match="has nothing to fine-tune"):
        train_chimera(train, tokens["train"], val, tokens["val"], row, 0, epochs=1, expert="app", encoder=frozen,
                      text_lr=0.5)


def test_train_chimera_in_bf16_mixed_follows_float32(tmp_path):
    """``precision="bf16-mixed"``: the training steps (topic layers, Lorentz geometry and the
    four losses, the sensitive parts in float32 inside) run under bfloat16 autocast: finite
    losses within 0.5% of float32's (measured: 0.03%), not equal to them, and a model that trains."""
    from polyfuse.engine.chimera_retrieval import ChimeraRow, encode_tokens, train_chimera
    from polyfuse.nn.sentence_encoder import StaticWordEncoder

    train, val, path = _tiny_corpus(tmp_path)
    row = ChimeraRow(num_topics=2, hyperbolic_dim=3)
    encoder = StaticWordEncoder(path)
    tokens = {name: encode_tokens(encoder, part.captions) for name, part in (("train", train), ("val", val))}
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        _, history = train_chimera(train, tokens["train"], val, tokens["val"], row, 0, epochs=4, batch_size=3,
                                   expert="app", precision=precision)
        losses[precision] = torch.tensor([h["loss"] for h in history])
    mixed, single = losses["bf16-mixed"], losses["32-true"]
    assert torch.isfinite(mixed).all() and mixed[-1] < mixed[0]
    assert not torch.equal(mixed, single)
    torch.testing.assert_close(mixed, single, rtol=0.005, atol=0)
