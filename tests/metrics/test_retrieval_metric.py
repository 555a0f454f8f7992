"""TextVideoRetrieval and text_video_retrieval against a brute-force ranking written from
the definitions: several captions per video, ties on purpose (small integer embeddings),
batches in any order with repeats, embeddings or a score matrix."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from polyfuse.metrics.retrieval import TextVideoRetrieval, text_video_retrieval

CAPTIONS_PER_VIDEO = [1, 3, 2, 4, 1, 2, 3]  # 7 videos, 16 captions


def _split(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    caption_video = torch.tensor([v for v, n in enumerate(CAPTIONS_PER_VIDEO) for _ in range(n)])
    # integers in [-2, 2] on 3 dimensions: many equal scores, all exact in float32
    texts = torch.randint(-2, 3, (len(caption_video), 3), generator=generator).float()
    videos = torch.randint(-2, 3, (len(CAPTIONS_PER_VIDEO), 3), generator=generator).float()
    return texts, videos, caption_video


def _brute_force(texts, videos, caption_video, ks=(1, 5, 10)):
    """Every number from its definition, in float64 Python loops."""
    score = [[sum(float(a) * float(b) for a, b in zip(t, v, strict=True)) for v in videos] for t in texts]
    owner = caption_video.tolist()
    num_captions, num_videos = len(score), len(score[0])
    t2v = []  # 1 + wrong videos scoring at least the correct one (ties count above)
    for c in range(num_captions):
        correct = score[c][owner[c]]
        t2v.append(1 + sum(score[c][v] >= correct for v in range(num_videos) if v != owner[c]))
    v2t = []  # 1 + wrong captions scoring at least the video's best caption
    for v in range(num_videos):
        best = max(score[c][v] for c in range(num_captions) if owner[c] == v)
        v2t.append(1 + sum(score[c][v] >= best for c in range(num_captions) if owner[c] != v))
    out = {}
    for name, ranks, gallery, correct_counts in (
        ("t2v_", t2v, num_videos, [1] * num_captions),
        ("v2t_", v2t, num_captions, [owner.count(v) for v in range(num_videos)]),
    ):
        out.update({f"{name}R@{k}": 100 * sum(r <= k for r in ranks) / len(ranks) for k in ks})
        out[f"{name}MedR"] = statistics.median(ranks)
        out[f"{name}MeanR"] = sum(ranks) / len(ranks)
        # random ranking: P(some correct item in the top k) = 1 - C(G - c, k) / C(G, k)
        for k in ks:
            top = min(k, gallery)
            chance = [1 - math.comb(gallery - c, top) / math.comb(gallery, top) for c in correct_counts]
            out[f"chance_{name}R@{k}"] = 100 * sum(chance) / len(chance)
    return out, t2v, v2t


def test_the_split_has_ties():
    texts, videos, _ = _split()
    scores = texts @ videos.T
    assert any(len(set(row)) < len(row) for row in scores.tolist())


def test_functional_equals_brute_force_from_embeddings_and_from_scores():
    texts, videos, caption_video = _split()
    expected, t2v, v2t = _brute_force(texts, videos, caption_video)
    assert max(t2v) > 1 and max(v2t) > 1 and min(t2v) == 1  # not a trivial ranking
    assert text_video_retrieval(caption_video, texts=texts, videos=videos, chunk_size=5) == pytest.approx(expected)
    assert text_video_retrieval(caption_video, scores=texts @ videos.T) == pytest.approx(expected)
    assert list(text_video_retrieval(caption_video, scores=texts @ videos.T)) == list(expected)


def test_metric_over_shuffled_batches_with_repeats_equals_brute_force():
    texts, videos, caption_video = _split(seed=3)
    expected, _, _ = _brute_force(texts, videos, caption_video)
    order = torch.randperm(len(caption_video), generator=torch.Generator().manual_seed(1))
    order = torch.cat([order, order[:3]])  # DDP's sampler pads with repeats
    metric = TextVideoRetrieval(chunk_size=4)
    for batch in order.split(5):  # caption-video pairs: each video as often as its captions
        metric.update(caption_rows=batch, caption_video=caption_video[batch], texts=texts[batch],
                      videos=videos[caption_video[batch]], video_rows=caption_video[batch])  # fmt: skip
    assert metric.compute() == pytest.approx(expected)
    metric.reset()
    for batch in order.split(4):  # scores against the whole gallery, captions only
        metric.update(caption_rows=batch, caption_video=caption_video[batch], scores=texts[batch] @ videos.T)
    assert metric.compute() == pytest.approx(expected)


def test_metric_takes_captions_and_videos_in_separate_batches():
    texts, videos, caption_video = _split(seed=4)
    expected, _, _ = _brute_force(texts, videos, caption_video)
    metric = TextVideoRetrieval(chance=False)
    metric.update(videos=videos[4:], video_rows=torch.arange(4, 7))
    rows = torch.arange(len(caption_video))
    metric.update(caption_rows=rows, caption_video=caption_video, texts=texts)
    metric.update(videos=videos[:4], video_rows=torch.arange(4))
    assert metric.compute() == pytest.approx({k: v for k, v in expected.items() if not k.startswith("chance")})


def test_constant_scores_rank_last():
    caption_video = torch.tensor([0, 0, 1, 2])
    values = text_video_retrieval(caption_video, scores=torch.zeros(4, 3))
    assert values["t2v_MedR"] == 3 and values["t2v_R@1"] == 0.0  # every wrong video ties above
    assert values["v2t_MeanR"] == pytest.approx((3 + 4 + 4) / 3)  # 4 captions, c correct: 4 - c + 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores": torch.zeros(2, 2), "texts": torch.zeros(2, 1), "videos": torch.zeros(2, 1)}, "not both"),
        ({"texts": torch.zeros(2, 1)}, "texts and videos go together"),
        ({"scores": torch.zeros(3, 2)}, r"caption_video must be a \(3,\) int64"),
        ({"scores": torch.zeros(2, 1)}, r"caption_video must lie in \[0, 1\)"),
        ({"scores": torch.zeros(2, 3)}, r"videos \[2\] have no caption \(1 such videos\)"),
    ],
)
def test_functional_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        text_video_retrieval(torch.tensor([0, 1]), **kwargs)


def test_metric_refuses_bad_input():
    metric = TextVideoRetrieval()
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(ValueError, match="no caption was added"):
        metric.compute()
    with pytest.raises(ValueError, match="caption_rows, caption_video and texts"):
        metric.update(texts=torch.zeros(2, 3), caption_rows=torch.arange(2))
    with pytest.raises(ValueError, match="videos and video_rows go together"):
        metric.update(videos=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"video_rows \(3,\) must be \(B,\) int64 beside \(B, ...\) values, got \(2, 3\)"):
        metric.update(videos=torch.zeros(2, 3), video_rows=torch.arange(3))
    metric.update(caption_rows=torch.arange(2), caption_video=torch.tensor([0, 5]), texts=torch.zeros(2, 3))
    metric.update(videos=torch.zeros(1, 3), video_rows=torch.tensor([0]))
    with pytest.raises(ValueError, match="caption row 1 belongs to video row 5, which no update gave"):
        metric.compute()
    metric.update(caption_rows=torch.arange(2, 3), caption_video=torch.tensor([0]), scores=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="some updates gave texts, others scores"):
        metric.compute()
