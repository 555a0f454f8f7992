"""Retrieval metrics against hand-computed rankings and brute-force loops."""

import math

import pytest
import torch

from polyfuse.metrics.retrieval import (
    chance_recall,
    chunked_similarity,
    query_targets,
    ranks_from_scores,
    retrieval_metrics,
    retrieval_ranks,
)


def test_ranks_hand_computed_with_pessimistic_ties():
    # 3 caption queries, 3 videos; captions 0 and 1 belong to video "a", caption 2 to "c".
    gallery = torch.eye(3)  # videos a, b, c as unit vectors: score = query coordinate
    queries = torch.tensor(
        [
            [0.9, 0.1, 0.0],  # video a scores highest: rank 1
            [0.5, 0.5, 0.7],  # a ties with b (counts above) and c is higher: rank 3
            [0.2, 0.3, 0.1],  # c is lowest: rank 3
        ]
    )
    targets = query_targets(["a", "a", "c"], ["a", "b", "c"])
    ranks = retrieval_ranks(queries, gallery, targets, chunk_size=2)
    assert ranks.tolist() == [1, 3, 3]
    metrics = retrieval_metrics(ranks, 3)
    assert metrics.recall[1] == pytest.approx(100 / 3)
    assert metrics.recall[5] == 100.0
    assert metrics.median_rank == 3.0
    assert metrics.mean_rank == pytest.approx(7 / 3)


def test_video_to_text_best_of_several_captions():
    # one video query, 4 captions; captions 1 and 3 are correct; scores 0.4, 0.1, 0.8, 0.3
    queries = torch.tensor([[1.0]])
    gallery = torch.tensor([[0.4], [0.1], [0.8], [0.3]])
    targets = query_targets(["v"], ["w", "v", "x", "v"])
    # best correct is caption 3 (0.3); wrong captions above it: 0.4 and 0.8 -> rank 3
    assert retrieval_ranks(queries, gallery, targets).tolist() == [3]


def test_constant_scores_rank_last_not_first():
    queries = torch.ones(2, 4)
    gallery = torch.ones(5, 4)
    targets = query_targets(["v1", "v2"], ["v0", "v1", "v2", "v3", "v4"])
    assert retrieval_ranks(queries, gallery, targets).tolist() == [5, 5]


def test_ranks_match_brute_force_any_chunk():
    g = torch.Generator().manual_seed(0)
    queries, gallery = torch.randn(37, 6, generator=g), torch.randn(11, 6, generator=g)
    owner = torch.randint(0, 11, (37,), generator=g)
    targets = torch.zeros(37, 11, dtype=torch.bool)
    targets[torch.arange(37), owner] = True
    expected = []
    for q in range(37):
        scores = [float(queries[q] @ gallery[j]) for j in range(11)]
        ordered = sorted(range(11), key=lambda j: (-scores[j], j == owner[q]))  # ties: wrong first
        expected.append(ordered.index(int(owner[q])) + 1)
    for chunk in (1, 5, 64):
        assert retrieval_ranks(queries, gallery, targets, chunk_size=chunk).tolist() == expected
        assert retrieval_ranks(queries, gallery, owner, chunk_size=chunk).tolist() == expected


def test_index_targets_tie_pessimistically():
    queries = torch.tensor([[1.0, 1.0]])
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.0]])  # scores 1, 1, 0.5
    assert retrieval_ranks(queries, gallery, torch.tensor([0])).tolist() == [2]


def test_median_of_even_count_is_mean_of_middle():
    assert retrieval_metrics(torch.tensor([1, 2, 7, 9]), 10).median_rank == 4.5


def test_chance_recall_formula():
    targets = query_targets(["a"], ["a", "b", "c", "d"])
    assert chance_recall(targets, ks=(1, 2))[1] == pytest.approx(25.0)
    # two correct among 5: P(hit within 2) = 1 - C(3,2)/C(5,2) = 1 - 3/10
    t2 = query_targets(["a"], ["a", "a", "b", "c", "d"])
    assert chance_recall(t2, ks=(2,))[2] == pytest.approx(100 * (1 - math.comb(3, 2) / math.comb(5, 2)))


def test_bad_input_names_the_id():
    with pytest.raises(ValueError, match="'zz'"):
        query_targets(["zz"], ["a", "b"])
    with pytest.raises(ValueError, match="empty id"):
        query_targets(["a"], ["a", ""])
    with pytest.raises(ValueError, match="queries is empty"):
        retrieval_ranks(torch.zeros(0, 3), torch.ones(2, 3), torch.zeros(0, 2, dtype=torch.bool))


def _three_by_three_scores(value: float, row: int, column: int) -> torch.Tensor:
    scores = torch.tensor([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.2, 0.4, 0.7]])
    scores[row, column] = value
    return scores


@pytest.mark.parametrize(
    ("value", "row", "column"),
    [
        (float("nan"), 1, 1),  # at the correct item: ranked 1 (a hit) before the check
        (float("nan"), 2, 0),  # at a wrong item: silently not counted above the correct one
        (float("inf"), 0, 2),
    ],
)
def test_ranks_from_scores_refuses_non_finite_scores_naming_where(value, row, column):
    scores = _three_by_three_scores(value, row, column)
    expected = rf"1 non-finite value \(NaN or Inf\) in the scores; the first is {value} at query {row}, item {column}"
    with pytest.raises(ValueError, match=expected):
        ranks_from_scores(scores, torch.eye(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=expected):
        ranks_from_scores(scores, torch.arange(3))


def test_ranks_from_scores_counts_every_non_finite_score_and_names_the_first():
    scores = _three_by_three_scores(float("nan"), 2, 2)
    scores[1, 2] = float("-inf")
    with pytest.raises(ValueError, match=r"^2 non-finite values .* the first is -inf at query 1, item 2$"):
        ranks_from_scores(scores, torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize(("side", "row"), [("queries", 1), ("gallery", 1), ("gallery", 2)])
def test_retrieval_ranks_refuses_nan_embeddings_naming_where(side, row):
    # query 1's correct item is gallery item 1 (a NaN there was rank 1); gallery 2 is a wrong item
    queries, gallery = torch.eye(3), torch.eye(3)
    {"queries": queries, "gallery": gallery}[side][row, 0] = float("nan")
    with pytest.raises(ValueError, match=rf"^1 non-finite value \(NaN or Inf\) in {side}; the first is nan at row {row}, column 0$"):
        retrieval_ranks(queries, gallery, torch.eye(3, dtype=torch.bool))


def test_retrieval_ranks_refuses_scores_that_overflow_to_inf_across_chunks():
    # finite embeddings whose inner products overflow float32 (1e20 * 1e20 = 1e40 > 3.4e38)
    queries = torch.tensor([[1.0, 0.0], [0.0, 1e20], [0.0, -1e20]])
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1e20]])
    targets = torch.tensor([0, 1, 1])
    expected = r"^2 non-finite values \(NaN or Inf\) in the scores; the first is inf at query 1, item 1$"
    for chunk in (1, 2, 3):  # the count covers the later chunks too
        with pytest.raises(ValueError, match=expected):
            retrieval_ranks(queries, gallery, targets, chunk_size=chunk)


def _chance_by_enumeration(correct_per_query: list[int], gallery: int, k: int) -> float:
    """Expected recall@k of a uniform random ranking, by enumerating every permutation."""
    import itertools

    hits = []
    for c in correct_per_query:
        orders = list(itertools.permutations(range(gallery)))  # items 0..c-1 are the correct ones
        hits.append(sum(min(order.index(j) for j in range(c)) < k for order in orders) / len(orders))
    return 100.0 * sum(hits) / len(hits)


def test_chance_recall_equals_enumeration_over_queries_with_different_counts():
    # one correct item of 4, and every item correct: the mean over queries, 100 for the second
    targets = torch.tensor([[True, False, False, False], [True, True, True, True], [True, True, False, False]])
    got = chance_recall(targets, ks=(1, 2, 3, 5))
    for k in (1, 2, 3, 5):
        assert got[k] == pytest.approx(_chance_by_enumeration([1, 4, 2], 4, k))
    assert got[1] == pytest.approx((25.0 + 100.0 + 50.0) / 3)


def test_retrieval_metrics_of_an_odd_count_and_of_one_query():
    metrics = retrieval_metrics(torch.tensor([9, 1, 3, 8, 2]), 12)
    assert metrics.median_rank == 3.0  # sorted 1 2 3 8 9: the middle one
    assert (metrics.num_queries, metrics.num_gallery) == (5, 12)
    assert metrics.recall == {1: 20.0, 5: 60.0, 10: 100.0}
    single = retrieval_metrics(torch.tensor([4]), 7)
    assert (single.median_rank, single.mean_rank, single.num_queries) == (4.0, 4.0, 1)


def test_ranks_are_int64():
    queries, gallery = torch.eye(3), torch.eye(3)
    assert retrieval_ranks(queries, gallery, torch.eye(3, dtype=torch.bool)).dtype == torch.int64
    assert retrieval_ranks(queries, gallery, torch.arange(3)).dtype == torch.int64


def test_the_non_finite_count_covers_later_chunks_of_any_size():
    queries = torch.tensor([[0.0, 1e20], [0.0, -1e20], [1.0, 0.0]])
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1e20], [1.0, 0.0]])  # row 2's three scores are finite
    expected = r"^2 non-finite values \(NaN or Inf\) in the scores; the first is inf at query 0, item 1$"
    with pytest.raises(ValueError, match=expected):
        retrieval_ranks(queries, gallery, torch.tensor([0, 0, 0]), chunk_size=1)


Q3 = torch.ones(3, 4)  # 3 queries of size 4
G5 = torch.ones(5, 4)  # 5 gallery items


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: retrieval_ranks(Q3.long(), G5, torch.arange(3)), r"queries must be a \(N, d\) float tensor"),
        (lambda: retrieval_ranks(torch.ones(4), G5, torch.arange(3)), r"queries must be a \(N, d\) float tensor"),
        (lambda: retrieval_ranks([[1.0]], G5, torch.arange(3)), r"queries must be a \(N, d\) float tensor"),
        (lambda: retrieval_ranks(Q3, torch.ones(5, 4, 1), torch.arange(3)), r"gallery must be a \(N, d\) float tensor"),
        (lambda: retrieval_ranks(Q3, torch.ones(5, 6), torch.arange(3)), "queries have size 4 but gallery items have 6"),
        (lambda: retrieval_ranks(Q3, G5, torch.arange(3), chunk_size=0), "chunk_size must be >= 1, got 0"),
        (lambda: list(chunked_similarity(Q3, G5, chunk_size=-2)), "chunk_size must be >= 1, got -2"),
        (lambda: retrieval_ranks(Q3, G5, torch.arange(3).float()),
         r"targets must be a \(Q, G\) bool tensor or a \(Q,\) int64 tensor of indices"),
        (lambda: retrieval_ranks(Q3, G5, [0, 1, 2]),
         r"targets must be a \(Q, G\) bool tensor or a \(Q,\) int64 tensor of indices"),
        (lambda: retrieval_ranks(Q3, G5, torch.arange(2)), r"targets has shape \(2,\), expected \(3,\)"),
        (lambda: retrieval_ranks(Q3, G5, torch.tensor([0, 5, 1])), r"target indices must lie in \[0, 5\)"),
        (lambda: retrieval_ranks(Q3, G5, torch.tensor([0, -1, 1])), r"target indices must lie in \[0, 5\)"),
        (lambda: retrieval_ranks(Q3, G5, torch.ones(3, 4, dtype=torch.bool)),
         r"targets has shape \(3, 4\), expected \(3, 5\)"),
        (lambda: ranks_from_scores(torch.ones(3), torch.arange(3)), r"scores must be a \(Q, G\) float tensor"),
        (lambda: ranks_from_scores(torch.ones(3, 3, dtype=torch.long), torch.arange(3)),
         r"scores must be a \(Q, G\) float tensor"),
        (lambda: ranks_from_scores("scores", torch.arange(3)), r"scores must be a \(Q, G\) float tensor"),
        (lambda: ranks_from_scores(torch.ones(3, 3), torch.ones(3, 2, dtype=torch.bool)),
         r"scores \(3, 3\) and targets \(3, 2\) differ"),
        (lambda: ranks_from_scores(torch.ones(2, 3), torch.tensor([[True, False, False], [False, False, False]])),
         "every query needs at least one correct gallery item"),
        (lambda: retrieval_metrics(torch.tensor([], dtype=torch.long), 5), "ranks must be a non-empty 1-d tensor"),
        (lambda: retrieval_metrics(torch.ones(2, 2, dtype=torch.long), 5), "ranks must be a non-empty 1-d tensor"),
        (lambda: retrieval_metrics([1, 2], 5), "ranks must be a non-empty 1-d tensor"),
    ],
)
def test_each_bad_input_is_refused_with_its_message(call, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        call()


def test_queries_without_a_correct_item_are_listed_ten_at_most():
    targets = torch.zeros(13, 5, dtype=torch.bool)
    targets[0, 2] = True  # query 0 has its item; 1..12 have none
    with pytest.raises(ValueError, match=r"^queries \[1, 2, 3, 4, 5, 6, 7, 8, 9, 10\] have no correct gallery item$"):
        retrieval_ranks(torch.ones(13, 4), G5, targets)
