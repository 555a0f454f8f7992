"""Contrastive losses against loops written from their definitions."""

import math

import pytest
import torch

from polyfuse.functional.contrastive import info_nce_loss, max_margin_ranking_loss


def _case():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(5, 4, generator=g, dtype=torch.float64)
    owner = [0, 1, 1, 2, 3]  # texts 1 and 2 share video 1
    positives = torch.zeros(5, 4, dtype=torch.bool)
    for i, j in enumerate(owner):
        positives[i, j] = True
    return scores, positives, owner


@pytest.mark.parametrize("hardest", [True, False])
def test_max_margin_matches_loop(hardest):
    scores, positives, owner = _case()
    m = 0.3
    total = []
    for i, j in enumerate(owner):
        t2v = [max(0.0, m - scores[i, j].item() + scores[i, k].item()) for k in range(4) if k != j]
        v2t = [
            max(0.0, m - scores[i, j].item() + scores[t, j].item())
            for t in range(5)
            if owner[t] != j
        ]
        agg = max if hardest else sum
        total.append(agg(t2v) + agg(v2t))
    expected = sum(total) / len(total)
    got = max_margin_ranking_loss(scores, positives, margin=m, hardest=hardest)
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_info_nce_matches_loop():
    scores, positives, owner = _case()
    tau = 0.5
    t2v, v2t = [], []
    for i, j in enumerate(owner):
        pos = math.exp(scores[i, j].item() / tau)
        neg_v = sum(math.exp(scores[i, k].item() / tau) for k in range(4) if k != j)
        neg_t = sum(math.exp(scores[t, j].item() / tau) for t in range(5) if owner[t] != j)
        t2v.append(-math.log(pos / (pos + neg_v)))
        v2t.append(-math.log(pos / (pos + neg_t)))
    expected = 0.5 * (sum(t2v) / 5 + sum(v2t) / 5)
    assert info_nce_loss(scores, positives, temperature=tau).item() == pytest.approx(expected, rel=1e-12)


def test_perfect_separation_gives_zero_margin_loss():
    scores = torch.eye(3) * 2 - 1  # positives 1, negatives -1
    assert max_margin_ranking_loss(scores, torch.eye(3, dtype=torch.bool), margin=0.5).item() == 0.0


def test_video_without_positive_is_refused():
    with pytest.raises(ValueError, match="at least one positive"):
        info_nce_loss(torch.zeros(2, 2), torch.tensor([[True, False], [True, False]]))


def _loop_max_margin(scores, positives, margin, hardest):
    """Both sums of MAN sec. 3.3 for every positive pair, one score at a time."""
    rows, cols = positives.shape
    total, count = 0.0, 0
    for i in range(rows):
        for j in range(cols):
            if not positives[i, j]:
                continue
            s = scores[i, j].item()
            t2v = [max(0.0, margin - s + scores[i, k].item()) for k in range(cols) if not positives[i, k]]
            v2t = [max(0.0, margin - s + scores[t, j].item()) for t in range(rows) if not positives[t, j]]
            agg = max if hardest else sum
            total += (agg(t2v) if t2v else 0.0) + (agg(v2t) if v2t else 0.0)
            count += 1
    return total / count


def _loop_info_nce(scores, positives, tau):
    rows, cols = positives.shape
    t2v, v2t = [], []
    for i in range(rows):
        for j in range(cols):
            if not positives[i, j]:
                continue
            pos = math.exp(scores[i, j].item() / tau)
            neg_v = sum(math.exp(scores[i, k].item() / tau) for k in range(cols) if not positives[i, k])
            neg_t = sum(math.exp(scores[t, j].item() / tau) for t in range(rows) if not positives[t, j])
            t2v.append(-math.log(pos / (pos + neg_v)))
            v2t.append(-math.log(pos / (pos + neg_t)))
    return 0.5 * (sum(t2v) / len(t2v) + sum(v2t) / len(v2t))


def test_defaults_are_margin_0_2_hardest_negatives_and_temperature_0_05():
    scores, positives, _ = _case()
    scores = scores * 0.1  # small scores, so that the default margin 0.2 matters
    expected = _loop_max_margin(scores, positives, 0.2, hardest=True)
    assert expected > 0.0
    assert max_margin_ranking_loss(scores, positives).item() == pytest.approx(expected, rel=1e-12)
    expected = _loop_info_nce(scores, positives, 0.05)
    assert info_nce_loss(scores, positives).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("hardest", [True, False])
def test_a_text_positive_for_every_video_has_no_negative_and_adds_zero(hardest):
    # text 0 matches every video: no negative video, its text-to-video sums are empty;
    # video 2 has three captions, one of which is text 0
    scores = torch.tensor(
        [[0.9, 0.1, 0.4], [0.3, 0.8, 0.5], [0.6, 0.7, 0.2], [0.2, 0.1, 0.35]], dtype=torch.float64
    )
    positives = torch.tensor(
        [[True, True, True], [False, True, False], [False, False, True], [False, False, True]]
    )
    expected = _loop_max_margin(scores, positives, 0.5, hardest)
    got = max_margin_ranking_loss(scores, positives, margin=0.5, hardest=hardest)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    expected = _loop_info_nce(scores, positives, 0.3)
    assert info_nce_loss(scores, positives, temperature=0.3).item() == pytest.approx(expected, rel=1e-12)


def test_hardest_keeps_the_largest_term_of_each_direction():
    # by hand, margin 0.2: pair (0, 0) has score 0.5; its negative videos give
    # 0.2 - 0.5 + 0.45 = 0.15 and 0.2 - 0.5 + 0.4 = 0.1, its negative texts
    # 0.2 - 0.5 + 0.3 = 0 and 0.2 - 0.5 + 0.6 = 0.3; every term of pairs (1, 1) and
    # (2, 2) (score 0.9, negatives at most 0.6) is clamped to 0
    scores = torch.tensor([[0.5, 0.45, 0.4], [0.3, 0.9, 0.0], [0.6, 0.0, 0.9]], dtype=torch.float64)
    positives = torch.eye(3, dtype=torch.bool)
    hardest = max_margin_ranking_loss(scores, positives, margin=0.2)
    assert hardest.item() == pytest.approx((0.15 + 0.3) / 3, rel=1e-12)
    summed = max_margin_ranking_loss(scores, positives, margin=0.2, hardest=False)
    assert summed.item() == pytest.approx((0.15 + 0.1 + 0.0 + 0.3) / 3, rel=1e-12)


def test_bad_inputs_are_refused_with_the_argument_named():
    scores, positives, _ = _case()
    for loss in (max_margin_ranking_loss, info_nce_loss):
        with pytest.raises(ValueError, match=r"^scores must be a \(B_t, B_v\) float tensor$"):
            loss(scores.long(), positives)
        with pytest.raises(ValueError, match=r"^scores must be a \(B_t, B_v\) float tensor$"):
            loss(scores[0], positives[0])
        with pytest.raises(ValueError, match=r"^scores must be a \(B_t, B_v\) float tensor$"):
            loss(scores.numpy(), positives)
        with pytest.raises(ValueError, match=r"^positives must be a bool tensor$"):
            loss(scores, positives.long())
        with pytest.raises(ValueError, match=r"^positives must be a bool tensor$"):
            loss(scores, positives.numpy())
        with pytest.raises(ValueError, match=r"^positives has shape \(5, 3\), scores \(5, 4\)$"):
            loss(scores, positives[:, :3])
        no_text_positive = positives.clone()
        no_text_positive[2] = False  # text 2 has no video; video 1 keeps text 1
        message = r"^every text and every video of the batch needs at least one positive$"
        with pytest.raises(ValueError, match=message):
            loss(scores, no_text_positive)
        only_rows = torch.zeros(5, 4, dtype=torch.bool)
        only_rows[:, 0] = True  # every text has a positive, videos 1 to 3 none
        with pytest.raises(ValueError, match="every text and every video"):
            loss(scores, only_rows)
    with pytest.raises(ValueError, match=r"^margin must be positive, got 0.0$"):
        max_margin_ranking_loss(scores, positives, margin=0.0)
    with pytest.raises(ValueError, match=r"^temperature must be positive, got -1.0$"):
        info_nce_loss(scores, positives, temperature=-1.0)
    with pytest.raises(ValueError, match=r"^temperature must be positive, got 0.0$"):
        info_nce_loss(scores, positives, temperature=0.0)
