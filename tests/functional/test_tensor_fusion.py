"""Tests for the fusion functions of TFN (Zadeh et al., 2017) and LMF (Liu et al., 2018).

The references are explicit loops over indices (itertools.product over every entry
of the outer product), independent of the einsum code they check.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from polyfuse.functional import append_one, low_rank_fusion, tensor_fusion


def loop_outer(vectors):
    """Row-major flattened outer product of the [z_j, 1], one entry at a time: (B, prod(h_j + 1))."""
    augmented = [torch.cat([v, torch.ones(v.shape[0], 1, dtype=v.dtype)], dim=1) for v in vectors]
    sizes = [a.shape[1] for a in augmented]
    rows = []
    for b in range(vectors[0].shape[0]):
        row = []
        for index in itertools.product(*(range(s) for s in sizes)):
            entry = torch.ones((), dtype=vectors[0].dtype)
            for a, i in zip(augmented, index, strict=True):
                entry = entry * a[b, i]
            row.append(entry)
        rows.append(torch.stack(row))
    return torch.stack(rows)


def full_rank_weight(factors, rank_weights):
    """W = sum_r w_r outer_j W_j^{(r)}, flattened row-major to (prod_j (h_j + 1), O), by loops."""
    sizes = [f.shape[1] for f in factors]
    out_dim = factors[0].shape[2]
    rows = []
    for index in itertools.product(*(range(s) for s in sizes)):
        row = torch.zeros(out_dim, dtype=factors[0].dtype)
        for r in range(rank_weights.shape[0]):
            term = rank_weights[r] * torch.ones(out_dim, dtype=factors[0].dtype)
            for factor, i in zip(factors, index, strict=True):
                term = term * factor[r, i]
            row = row + term
        rows.append(row)
    return torch.stack(rows)


def random_low_rank(sizes, rank=3, out_dim=4, batch=5, seed=6):
    generator = torch.Generator().manual_seed(seed)
    vectors = [torch.randn(batch, h, generator=generator, dtype=torch.float64) for h in sizes]
    factors = [
        torch.randn(rank, h + 1, out_dim, generator=generator, dtype=torch.float64) for h in sizes
    ]
    rank_weights = torch.randn(rank, generator=generator, dtype=torch.float64)
    bias = torch.randn(out_dim, generator=generator, dtype=torch.float64)
    return vectors, factors, rank_weights, bias


def test_append_one_by_hand():
    z = torch.tensor([[2.0, -3.0], [0.5, 0.0]])
    assert append_one(z).tolist() == [[2.0, -3.0, 1.0], [0.5, 0.0, 1.0]]


@pytest.mark.parametrize("sizes", [(2, 3), (2, 1, 3), (4,)])
def test_tensor_fusion_matches_loop_outer_product(sizes):
    generator = torch.Generator().manual_seed(4)
    vectors = [torch.randn(3, h, generator=generator, dtype=torch.float64) for h in sizes]
    fused = tensor_fusion(vectors)
    torch.testing.assert_close(fused, loop_outer(vectors), rtol=0, atol=1e-12)
    # the appended 1s keep the unimodal features: the last entry is 1 and the
    # entries next to it are the last modality's features
    torch.testing.assert_close(fused[:, -1], torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(fused[:, -1 - sizes[-1] : -1], vectors[-1])


def test_tensor_fusion_of_two_vectors_by_hand():
    """TFN's bimodal case written out: [a, 1] ⊗ [v, 1] = [a1 v1, a1, v1, 1] for 1-d vectors."""
    a, v = torch.tensor([[2.0]]), torch.tensor([[-3.0]])
    assert tensor_fusion([a, v]).tolist() == [[-6.0, 2.0, -3.0, 1.0]]


def test_tensor_fusion_needs_a_vector():
    with pytest.raises(ValueError, match=r"^tensor_fusion needs at least one vector$"):
        tensor_fusion([])


@pytest.mark.parametrize("sizes", [(2, 3), (3, 1, 2)])
def test_low_rank_fusion_equals_full_rank_tensor_fusion(sizes):
    """LMF's identity: W · (outer_j [z_j, 1]) + b with W = sum_r w_r outer_j W_j^{(r)}."""
    vectors, factors, rank_weights, bias = random_low_rank(sizes)
    expected = loop_outer(vectors) @ full_rank_weight(factors, rank_weights) + bias
    result = low_rank_fusion(vectors, factors, rank_weights, bias=bias)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-10)
    without_bias = low_rank_fusion(vectors, factors, rank_weights)
    torch.testing.assert_close(without_bias, expected - bias, rtol=0, atol=1e-10)


def test_low_rank_fusion_rank_one_by_hand():
    """Rank 1, one output, two 1-d vectors: w * ([a, 1] · f_a) * ([v, 1] · f_v) + b."""
    a, v = torch.tensor([[2.0]]), torch.tensor([[3.0]])
    f_a = torch.tensor([[[5.0], [7.0]]])  # (R=1, 2, O=1)
    f_v = torch.tensor([[[-1.0], [4.0]]])
    result = low_rank_fusion([a, v], [f_a, f_v], torch.tensor([0.5]), bias=torch.tensor([10.0]))
    assert result.tolist() == [[0.5 * (2 * 5 + 7) * (3 * -1 + 4) + 10.0]]


def test_low_rank_fusion_errors_name_the_factor():
    vectors, factors, rank_weights, _ = random_low_rank((2, 3))
    with pytest.raises(ValueError, match=r"^low_rank_fusion: 2 vectors but 1 factors$"):
        low_rank_fusion(vectors, factors[:1], rank_weights)
    wrong = [factors[0], factors[1][:, :3]]
    with pytest.raises(
        ValueError,
        match=r"^low_rank_fusion: factor 1 has shape \(3, 3, 4\), expected \(rank, 4, out_dim\) "
        r"for a vector of size 3$",
    ):
        low_rank_fusion(vectors, wrong, rank_weights)
    with pytest.raises(ValueError, match=r"factor 0 has shape \(3, 4\)"):
        low_rank_fusion(vectors, [factors[0][0], factors[1]], rank_weights)
