"""Grounding's metric, model and loss against hand-built examples and brute-force loops."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from polyfuse.metrics.grounding import (
    GroundingRecall,
    box_targets,
    grounding_recall,
    phrase_scores,
    recall_counts,
)
from polyfuse.nn.models.grounding import BanGrounding, select_positions
from polyfuse.tasks.grounding.spec import grounding_loss

INF = float("inf")


def test_recall_and_upper_bound_on_a_hand_built_example():
    # 3 phrases over 4 boxes (the last padding in the first caption); the second caption
    # has one phrase and a padded one
    scores = torch.tensor([[[0.9, 0.1, 0.5, -INF], [0.2, 0.8, 0.1, -INF]],
                           [[0.3, 0.2, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    correct = torch.tensor([[[0, 0, 1, 0], [0, 1, 0, 0]],
                            [[0, 0, 0, 0], [1, 1, 1, 1]]], dtype=torch.bool)
    mask = torch.tensor([[True, True], [True, False]])
    hits, bound, count = recall_counts(scores, correct, mask, ks=(1, 2, 10))
    # phrase 1: correct box ranked 2nd; phrase 2: 1st; phrase 3: no correct box at all
    assert hits.tolist() == [1, 2, 2] and int(bound) == 2 and int(count) == 3
    metric = GroundingRecall(ks=(1, 2, 10))
    metric.update(scores[:1], correct[:1], mask[:1])
    metric.update(scores[1:], correct[1:], mask[1:])
    values = metric.compute()
    assert values["R@1"].item() == pytest.approx(1 / 3) and values["R@2"].item() == pytest.approx(2 / 3)
    assert values["R@10"].item() == pytest.approx(2 / 3) and values["upper_bound"].item() == pytest.approx(2 / 3)


def test_recall_counts_agree_with_grounding_recall():
    generator = torch.Generator().manual_seed(0)
    phrases, objects = 40, 12
    scores = torch.randn(phrases, objects, generator=generator)
    corners = torch.rand(phrases, objects, 2, generator=generator) * 50
    boxes = torch.cat([corners, corners + 20 + torch.rand(phrases, objects, 2, generator=generator) * 30], dim=-1)
    truths = [boxes[p, torch.randint(objects, (2,), generator=generator)] + torch.randn(2, 4, generator=generator) * 6
              for p in range(phrases)]
    correct = torch.stack([box_targets(boxes[p], truths[p]) for p in range(phrases)]).unsqueeze(0)
    hits, _, count = recall_counts(scores.unsqueeze(0), correct, torch.ones(1, phrases, dtype=torch.bool))
    expected = grounding_recall(scores, boxes, truths, merge="any")
    assert 0 < expected[1] < expected[10] < 1
    assert [h / int(count) for h in hits.tolist()] == pytest.approx([expected[k] for k in (1, 5, 10)])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BanGrounding(11, 6, hidden_dim=5, glimpses=2, k=2, dropout=0.0, attention_dropout=0.0).eval()


def test_phrase_scores_are_the_word_logits_at_the_phrase_positions(model):
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(12, (3, 7), generator=generator)
    image = torch.randn(3, 5, 6, generator=generator)
    image[0, 3:] = 0.0  # two padded boxes
    positions = torch.tensor([[6, 1, 0], [2, 0, 0], [4, 5, 3]])
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    with torch.no_grad():
        scores = model(tokens, image, positions, mask)  # (B, P, O)
        logits = model.word_logits(tokens, image)  # (B, G, O, L)
    for b in range(3):  # brute force: every phrase and box
        real = [p for p in range(3) if mask[b, p]]
        expected = phrase_scores(logits[b], [int(positions[b, p]) for p in real])  # summed over the glimpses
        torch.testing.assert_close(scores[b, real], expected)
        for p in real:
            for o in range(5):
                if image[b, o].abs().sum() == 0:
                    assert scores[b, p, o] == -INF
                else:
                    assert scores[b, p, o] == pytest.approx(sum(logits[b, g, o, positions[b, p]].item() for g in range(2)),
                                                             abs=1e-5)
        assert (scores[b, ~mask[b]] == -INF).all()


def test_select_positions_is_a_gather():
    states = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    positions = torch.tensor([[3, 0], [1, 1]])
    picked = select_positions(states, positions)
    assert torch.equal(picked, torch.stack([states[0, [3, 0]], states[1, [1, 1]]]))
    with pytest.raises(ValueError, match="outside"):
        select_positions(states, torch.tensor([[4, 0], [0, 0]]))


def test_the_loss_is_bce_summed_over_real_pairs_per_caption():
    scores = torch.tensor([[[2.0, -1.0, -INF], [0.5, 0.0, -INF]], [[1.0, 3.0, -2.0], [-INF, -INF, -INF]]])
    targets = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]])
    phrases = torch.tensor([[True, True], [True, False]])
    boxes = torch.tensor([[True, True, False], [True, True, True]])
    total = 0.0
    for b in range(2):
        for p in range(2):
            for o in range(3):
                if phrases[b, p] and boxes[b, o]:
                    x, t = scores[b, p, o].item(), targets[b, p, o].item()
                    total += -(t * math.log(1 / (1 + math.exp(-x))) + (1 - t) * math.log(1 - 1 / (1 + math.exp(-x))))
    loss = grounding_loss(scores, targets, phrases, boxes)
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(total / 2, rel=1e-6)
    assert F.binary_cross_entropy_with_logits(scores, targets).isnan()  # why the padding is left out
