"""``retrieval.renormalize_weights``: collaborative experts' mixture weights renormalised over
the experts each video has (CE's model/model.py, ``sharded_cross_view_inner_product``),
by hand, unchanged when every expert is there, and through the whole-split ranking."""

import lightning as L
import pytest
import torch

from polyfuse.engine.config import resolve_config
from polyfuse.metrics.retrieval import text_video_retrieval
from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.tasks.registry import task_spec


def _videos():
    g = torch.Generator().manual_seed(0)
    features = [torch.randn(2, 3, 5, generator=g), torch.randn(2, 2, 6, generator=g)]
    masks = [torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)]
    present = torch.tensor([[True, True], [True, False]])  # video 1 lacks expert 1
    return features, masks, present


def _pair(fusion="gating"):
    torch.manual_seed(0)
    plain = RetrievalModel(5, [5, 6], embed_dim=4, fusion=fusion, hidden_dim=8).eval()
    renormalized = RetrievalModel(5, [5, 6], embed_dim=4, fusion=fusion, hidden_dim=8, renormalize_weights=True).eval()
    renormalized.load_state_dict(plain.state_dict())
    return plain, renormalized


def test_two_experts_one_missing_by_hand():
    """Video 1 lacks expert 1: the weights over its experts become [1, 0], its score the
    cosine of expert 0 alone; video 0 has both: the softmax weights as they are."""
    plain, model = _pair()
    features, masks, present = _videos()
    sentences = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        scores = model.similarity(model.embed_texts(sentences), model.embed_videos(features, masks, present))
        per_expert = plain.embed_videos(features, masks, present).view(2, 2, 4)  # (video, expert, D)
        head = plain.text_head
        expected = torch.zeros(3, 2)
        for t in range(3):
            w = torch.softmax(head.mixture(sentences[t]), dim=0).tolist()
            cos = [[float(head.units[i](sentences[t]) @ per_expert[v, i]) for i in range(2)] for v in range(2)]
            for v in range(2):  # CE: w_i p_i / sum_j w_j p_j, then the weighted sum of cosines
                p = [float(present[v, i]) for i in range(2)]
                weights = [w[i] * p[i] / (w[0] * p[0] + w[1] * p[1]) for i in range(2)]
                expected[t, v] = sum(weights[i] * cos[v][i] for i in range(2))
            assert weights == pytest.approx([1.0, 0.0])  # the last v: video 1
            assert expected[t, 1] == pytest.approx(cos[1][0])
            assert w[0] < 0.99  # so that the renormalisation changes video 1's score
        plain_scores = plain.similarity(plain.embed_texts(sentences), plain.embed_videos(features, masks, present))
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores[:, 0], plain_scores[:, 0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(scores[:, 1], plain_scores[:, 1], atol=1e-3)  # plain: w_0 cos_0


@pytest.mark.parametrize("fusion", ["gating", "gating+man"])
def test_all_experts_present_changes_nothing(fusion):
    plain, model = _pair(fusion)
    features, masks, _ = _videos()
    present = torch.ones(2, 2, dtype=torch.bool)
    sentences = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        texts, videos = model.embed_texts(sentences), model.embed_videos(features, masks, present)
        assert texts.shape[1] == videos.shape[1] == plain.embed_texts(sentences).shape[1] + model.mixture_experts
        expected = plain.similarity(plain.embed_texts(sentences), plain.embed_videos(features, masks, present))
        torch.testing.assert_close(model.similarity(texts, videos), expected, rtol=1e-5, atol=1e-6)
        # the weights sum to 1 whatever the experts: plain gating+man with video 1's expert 1 gone differs
        if fusion == "gating+man":
            _, _, lacking = _videos()
            texts, videos = model.embed_texts(sentences), model.embed_videos(features, masks, lacking)
            assert torch.equal(videos[:, -3:], torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]))  # MAN always there


def test_renormalize_weights_is_refused_without_mixture_weights():
    with pytest.raises(ValueError, match="renormalize_weights applies to the mixture weights of gating"):
        RetrievalModel(5, [5, 6], embed_dim=4, fusion="mean", renormalize_weights=True)
    config = {"task": {"type": "retrieval"}, "model": {"fusion": "mean+man"},
              "retrieval": {"source": "synthetic:videos=20", "renormalize_weights": True}}
    with pytest.raises(ValueError, match=r"retrieval\.renormalize_weights applies to the mixture weights"):
        resolve_config(config)


def _brute_force_t2v(scores, caption_videos, video_ids):
    ranks = []
    for i, video in enumerate(caption_videos):
        correct = video_ids.index(video)
        ranks.append(1 + sum(1 for j in range(len(video_ids)) if j != correct and scores[i, j] >= scores[i, correct]))
    return torch.tensor(ranks, dtype=torch.float64)


def test_a_run_ranks_the_split_by_the_renormalised_scores(tmp_path):
    """Training and the whole-split ranking score pairs as CE does: test recalls equal a
    brute-force ranking of the hand-renormalised scores (some test videos lack an expert)."""
    spec = task_spec("retrieval")
    section = {"source": "synthetic:videos=300,steps=4", "text": "bow", "embed_dim": 8, "hidden_dim": 8,
               "renormalize_weights": True}
    config = resolve_config({"task": {"type": "retrieval"}, "seed": 3, "output_dir": str(tmp_path / "runs"),
                             "retrieval": section, "data": {"batch_size": 16, "eval_batch_size": 7},
                             "optim": {"lr": 1e-2, "weight_decay": 1e-4}, "model": {"fusion": "gating"},
                             "trainer": {"max_epochs": 1}})
    data = spec.build_data(config)
    test = data.prepared.splits["test"]
    lacking = test.experts["expert1"]
    lacking._present[::2] = False  # every other test video lacks expert 1
    lacking.lengths[::2] = 0
    module = spec.build_module(config, data)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, enable_checkpointing=False)
    trainer.fit(module, datamodule=data.datamodule)
    (result,) = trainer.test(module, datamodule=data.datamodule, verbose=False)
    module.eval()
    model = module.model
    with torch.no_grad():
        sentences = data.prepared.vectors["test"]
        experts = list(test.experts.values())
        present = torch.stack([e.present for e in experts], dim=1)
        videos = model.embed_videos([e.features for e in experts], [e.mask for e in experts], present)[:, :-2]
        head = model.text_head
        weights = torch.softmax(head.mixture(sentences), dim=-1).double()  # (C, 2)
        cos = torch.stack([head.units[i](sentences).double() @ videos[:, 8 * i : 8 * i + 8].double().T
                           for i in range(2)], -1)  # (C, N, 2): embed_dim 8
        masked = weights.unsqueeze(1) * present.double().unsqueeze(0)  # (C, N, 2)
        scores = (masked / masked.sum(-1, keepdim=True) * cos).sum(-1)
        plain = (weights.unsqueeze(1) * present.double().unsqueeze(0) * cos).sum(-1)
    ranks = _brute_force_t2v(scores, test.caption_video, test.video_ids)
    plain_ranks = _brute_force_t2v(plain, test.caption_video, test.video_ids)
    assert not torch.equal(ranks, plain_ranks)  # the test tells the two scores apart
    for k in (1, 5, 10):
        assert result[f"test/t2v_R@{k}"] == pytest.approx(100 * float((ranks <= k).double().mean()), abs=1e-4)
    assert result["test/t2v_MeanR"] == pytest.approx(float(ranks.mean()), abs=1e-4)
    caption_video = torch.tensor([test.video_ids.index(v) for v in test.caption_video])
    expected = text_video_retrieval(caption_video, scores=scores.float(), chance=False)
    for key in ("v2t_R@1", "v2t_R@5", "v2t_MeanR"):
        assert result[f"test/{key}"] == pytest.approx(expected[key], abs=1e-3)


def test_a_scorer_ranks_in_chunks_as_its_whole_score_matrix():
    """``similarity`` of text_video_retrieval: chunks of 2 queries, both directions, equal
    to the ranking of the (C, N) score matrix it gives at once (video-to-text: its transpose)."""
    g = torch.Generator().manual_seed(4)
    texts, videos = torch.randn(9, 6, generator=g), torch.randn(5, 6, generator=g)
    texts[:, -2:], videos[:, -2:] = texts[:, -2:].abs() + 0.1, torch.tensor([[1.0, 0.0], [1.0, 1.0]]).repeat(3, 1)[:5]
    caption_video = torch.tensor([0, 0, 1, 2, 2, 3, 4, 4, 1])
    scorer = RetrievalModel(5, [5, 6], embed_dim=2, fusion="gating", renormalize_weights=True).score_function()
    whole = text_video_retrieval(caption_video, scores=scorer(texts, videos), chance=False)
    chunked = text_video_retrieval(caption_video, texts=texts, videos=videos, similarity=scorer, chunk_size=2,
                                   chance=False)
    assert chunked == pytest.approx(whole)
    assert chunked != pytest.approx(text_video_retrieval(caption_video, texts=texts, videos=videos, chance=False))
