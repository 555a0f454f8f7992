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
