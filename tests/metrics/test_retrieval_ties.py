"""Ranks do not depend on float32 rounding: a score a few ulps from the best correct one
ties with it (pessimistically), as an exactly equal one does, so the metrics of a split
do not change with the evaluation chunk size or the number of DDP processes."""

from __future__ import annotations

import torch

from polyfuse.metrics.retrieval import TIE_TOLERANCE, ranks_from_scores, text_video_retrieval


def test_a_rounding_apart_ties_and_a_real_difference_does_not():
    best = 0.73
    ulp = torch.finfo(torch.float32).eps * best
    for wrong, expected in ((best, 2), (best - 3 * ulp, 2), (best + 3 * ulp, 2), (best - 1e-3, 1), (best + 1e-3, 2)):
        scores = torch.tensor([[best, wrong, -1.0]])
        assert int(ranks_from_scores(scores, torch.tensor([0]))[0]) == expected, wrong
        targets = torch.tensor([[True, False, False]])
        assert int(ranks_from_scores(scores, targets)[0]) == expected, wrong
    assert 10 * ulp < TIE_TOLERANCE < 1e-3


def test_duplicate_captions_rank_alike_in_any_chunking():
    # two videos whose captions are the same text: their embeddings, computed in batches of
    # different sizes, differ by rounding only; the ranks must not see it
    generator = torch.Generator().manual_seed(0)
    videos = torch.nn.functional.normalize(torch.randn(5, 16, generator=generator), dim=1)
    texts = torch.nn.functional.normalize(torch.randn(6, 16, generator=generator), dim=1)
    texts[3] = texts[1]
    caption_video = torch.tensor([0, 1, 2, 3, 4, 0])
    exact = text_video_retrieval(caption_video, texts=texts, videos=videos)
    for factor in (1 + 4 * torch.finfo(torch.float32).eps, 1 - 4 * torch.finfo(torch.float32).eps):
        nudged = texts.clone()
        nudged[3] = texts[3] * factor
        assert text_video_retrieval(caption_video, texts=nudged, videos=videos) == exact, factor


def test_the_tolerance_is_relative_above_one_and_inclusive():
    # float64: the margins below are far from rounding
    for best, inside, outside in ((1000.0, 5e-3, 2e-2), (1.5, 1.4e-5, 1.8e-5), (0.2, 0.9e-5, 1.1e-5)):
        for margin, expected in ((inside, 2), (outside, 1)):
            scores = torch.tensor([[best, best - margin, -1.0]], dtype=torch.float64)
            assert int(ranks_from_scores(scores, torch.tensor([0]))[0]) == expected, (best, margin)
            assert int(ranks_from_scores(scores, torch.tensor([[True, False, False]]))[0]) == expected, (best, margin)
    # a wrong score exactly at the edge of the tolerance ties (the edge is inside)
    best = torch.tensor(1000.0, dtype=torch.float64)
    edge = best - TIE_TOLERANCE * best
    scores = torch.stack([best, edge, torch.tensor(-1.0, dtype=torch.float64)]).unsqueeze(0)
    assert int(ranks_from_scores(scores, torch.tensor([0]))[0]) == 2
    assert int(ranks_from_scores(scores, torch.tensor([[True, False, False]]))[0]) == 2
