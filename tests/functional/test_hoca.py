"""Tests for polyfuse.functional.hoca: Bahdanau attention, HOCA and Low-Rank HOCA.

The references here are written with explicit Python loops over time steps and
index tuples, straight from the paper's equations, independent of the einsum and
reshape code they check.
"""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch
from torch.autograd import gradcheck

from polyfuse.functional.hoca import (
    bahdanau_attention,
    cp_weight_tensor,
    high_order_correlation,
    hoca_attention,
    hoca_attention_all_targets,
    low_rank_hoca_attention,
    low_rank_hoca_attention_all_targets,
    query_conditioned_features,
)

F64 = torch.float64
LENGTHS = [3, 5, 4, 2]  # unequal lengths for n = 2, 3, 4


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


def random_masks(gen, lengths, batch):
    """(B, T_i) masks: sample 0 full, the last with one real step, others random."""
    masks = []
    for length in lengths:
        real = torch.randint(1, length + 1, (batch,), generator=gen)
        real[0], real[-1] = length, 1
        masks.append(torch.arange(length)[None, :] < real[:, None])
    return masks


def random_problem(n, *, batch=3, dim=4, rank=3, seed=0, dtype=F64):
    gen = generator(seed)
    lengths = LENGTHS[:n]
    features = [torch.randn(batch, t, dim, generator=gen, dtype=dtype) for t in lengths]
    factors = [torch.randn(rank, t, generator=gen, dtype=dtype) for t in lengths]
    return features, factors, random_masks(gen, lengths, batch)


def non_target(items, target):
    return [x for i, x in enumerate(items) if i != target]


def loop_softmax(logits, mask):
    """Eq. 2 / 9 / 17 normalisation over the real steps of a 1-d list of logits."""
    exps = [math.exp(v) if real else 0.0 for v, real in zip(logits, mask, strict=True)]
    total = sum(exps)
    return torch.tensor([e / total for e in exps], dtype=F64)


def loop_correlation_entry(features, masks, b, index):
    """Eq. 7: sum_d prod_i I_i[d, r_i], zero if some r_i is padded."""
    if not all(bool(m[b, r]) for m, r in zip(masks, index, strict=True)):
        return 0.0
    dim = features[0].shape[2]
    total = 0.0
    for d in range(dim):
        product = 1.0
        for x, r in zip(features, index, strict=True):
            product *= float(x[b, r, d])
        total += product
    return total


def loop_hoca(features, target, weight, masks):
    """Eq. 9 by brute force over every index tuple of the non-target modalities."""
    lengths = [x.shape[1] for x in features]
    others = non_target(range(len(features)), target)
    out = []
    for b in range(features[0].shape[0]):
        logits = []
        for r_target in range(lengths[target]):
            total = 0.0
            for rest in itertools.product(*[range(lengths[i]) for i in others]):
                index = list(rest)
                index.insert(target, r_target)
                total += float(weight[rest]) * loop_correlation_entry(features, masks, b, index)
            logits.append(total)
        out.append(loop_softmax(logits, masks[target][b].tolist()))
    return torch.stack(out)


def loop_low_rank(features, target, factors, weight_vector, masks):
    """Eq. 14-17 by loops: (I'_i)_j = sum_r w_j[r] I_i[r], B_l = sum_j prod_i, logits."""
    batch, _, dim = features[0].shape
    rank = next(f for i, f in enumerate(factors) if i != target).shape[0]
    out = []
    for b in range(batch):
        summary = [0.0] * dim  # B_l, Eq. 16
        for j in range(rank):
            product = [1.0] * dim
            for i, x in enumerate(features):
                if i == target:
                    continue
                for d in range(dim):
                    product[d] *= sum(
                        float(factors[i][j, r]) * float(x[b, r, d])
                        for r in range(x.shape[1])
                        if masks[i][b, r]
                    )  # Eq. 14
            summary = [s + p for s, p in zip(summary, product, strict=True)]
        x = features[target]
        logits = [
            sum(float(weight_vector[d]) * float(x[b, r, d]) * summary[d] for d in range(dim))
            for r in range(x.shape[1])
        ]  # Eq. 17
        out.append(loop_softmax(logits, masks[target][b].tolist()))
    return torch.stack(out)


# ---------------------------------------------------------------------------
# Unary attention, Eq. 2 to 5
# ---------------------------------------------------------------------------


def bahdanau_parameters(gen, query_dim, feature_dim, dim):
    return {
        "query_weight": torch.randn(dim, query_dim, generator=gen, dtype=F64),
        "feature_weight": torch.randn(dim, feature_dim, generator=gen, dtype=F64),
        "score_vector": torch.randn(dim, generator=gen, dtype=F64),
        "bias": torch.randn(dim, generator=gen, dtype=F64),
    }


def test_query_conditioned_features_matches_loop():
    gen = generator(1)
    query = torch.randn(2, 3, generator=gen, dtype=F64)
    features = torch.randn(2, 4, 5, generator=gen, dtype=F64)
    p = bahdanau_parameters(gen, 3, 5, 6)
    mapped = query_conditioned_features(
        query,
        features,
        query_weight=p["query_weight"],
        feature_weight=p["feature_weight"],
        bias=p["bias"],
    )
    for b in range(2):
        for r in range(4):
            expected = torch.tanh(
                p["query_weight"] @ query[b] + p["feature_weight"] @ features[b, r] + p["bias"]
            )
            torch.testing.assert_close(mapped[b, r], expected, rtol=0, atol=1e-12)


def test_unary_attention_equals_bahdanau_by_hand():
    gen = generator(2)
    batch, length, query_dim, feature_dim, dim = 3, 6, 4, 5, 7
    query = torch.randn(batch, query_dim, generator=gen, dtype=F64)
    features = torch.randn(batch, length, feature_dim, generator=gen, dtype=F64)
    (mask,) = random_masks(gen, [length], batch)
    p = bahdanau_parameters(gen, query_dim, feature_dim, dim)
    attention, context = bahdanau_attention(query, features, mask, **p)
    for b in range(batch):
        logits = [
            float(
                p["score_vector"]
                @ torch.tanh(
                    p["query_weight"] @ query[b] + p["feature_weight"] @ features[b, r] + p["bias"]
                )
            )
            for r in range(length)
        ]  # Eq. 3
        expected = loop_softmax(logits, mask[b].tolist())  # Eq. 2
        torch.testing.assert_close(attention[b], expected, rtol=0, atol=1e-12)
        expected_context = sum(expected[r] * features[b, r] for r in range(length))  # Eq. 5
        torch.testing.assert_close(context[b], expected_context, rtol=0, atol=1e-12)
    torch.testing.assert_close(attention.sum(-1), torch.ones(batch, dtype=F64))  # Eq. 4
    assert bool((attention[~mask] == 0).all())


def test_unary_attention_ignores_padded_content():
    gen = generator(3)
    query = torch.randn(2, 3, generator=gen, dtype=F64)
    features = torch.randn(2, 5, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    p = bahdanau_parameters(gen, 3, 4, 6)
    reference = bahdanau_attention(query, features, mask, **p)
    poisoned = features.clone()
    poisoned[1, 2:] = float("nan")
    result = bahdanau_attention(query, poisoned, mask, **p)
    for got, expected in zip(result, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # and cutting sample 1 to its real steps gives the same answer
    cut = bahdanau_attention(query[1:], features[1:, :2], None, **p)
    torch.testing.assert_close(cut[0][0], reference[0][1, :2], rtol=0, atol=1e-14)
    torch.testing.assert_close(cut[1][0], reference[1][1], rtol=0, atol=1e-14)


# ---------------------------------------------------------------------------
# Exact HOCA, Eq. 7 to 9
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4])
def test_correlation_tensor_matches_loops(n):
    features, _, masks = random_problem(n, batch=2, dim=3, seed=n)
    correlation = high_order_correlation(features, masks)
    assert correlation.shape == (2, *LENGTHS[:n])
    for b in range(2):
        for index in itertools.product(*[range(t) for t in LENGTHS[:n]]):
            expected = loop_correlation_entry(features, masks, b, index)
            assert abs(float(correlation[(b, *index)]) - expected) < 1e-12


@pytest.mark.parametrize("n", [2, 3, 4])
def test_hoca_attention_matches_brute_force(n):
    features, _, masks = random_problem(n, batch=2, dim=3, seed=10 + n)
    gen = generator(20 + n)
    for target in range(n):
        weight = torch.randn(non_target(LENGTHS[:n], target), generator=gen, dtype=F64)
        attention = hoca_attention(features, target, weight, masks)
        expected = loop_hoca(features, target, weight, masks)
        torch.testing.assert_close(attention, expected, rtol=0, atol=1e-12)


def test_cp_weight_tensor_matches_loops():
    gen = generator(4)
    factors = [torch.randn(3, t, generator=gen, dtype=F64) for t in (2, 4, 3)]
    tensor = cp_weight_tensor(factors)
    assert tensor.shape == (2, 4, 3)
    for index in itertools.product(range(2), range(4), range(3)):
        expected = sum(
            math.prod(float(f[j, r]) for f, r in zip(factors, index, strict=True)) for j in range(3)
        )  # Eq. 11
        assert abs(float(tensor[index]) - expected) < 1e-12


def test_hoca_refuses_one_oversized_sample_and_names_its_size():
    features = [torch.zeros(4, 100, 32) for _ in range(8)]
    weight = torch.zeros(1).expand([100] * 7)  # the right shape, no memory
    with pytest.raises(ValueError) as error:
        hoca_attention(features, 0, weight)
    message = str(error.value)
    correlation = 100**8  # one sample: T_1 x ... x T_8
    intermediate = 32 * 100**7  # (d, T_1, ..., T_7) before the last product over d
    assert f"{correlation + intermediate:,}" in message
    assert "max_elements" in message and "one sample" in message
    assert "100 x 100 x 100" in message and "4 x 100" not in message
    # a small case just above a lowered bound is refused, and allowed once raised
    small, _, _ = random_problem(3, batch=2)
    needed = 3 * 5 * 4 + 4 * 3 * 4  # one sample: tensor + (d, T_0, T_2) intermediate
    with pytest.raises(ValueError, match=f"needs {needed:,} elements"):
        hoca_attention(small, 1, torch.ones(3, 4, dtype=F64), max_elements=needed - 1)
    with pytest.raises(ValueError, match=f"needs {needed:,} elements"):
        high_order_correlation(small, max_elements=needed - 1)
    expected = loop_hoca(small, 0, torch.ones(5, 4, dtype=F64), [torch.ones(2, t, dtype=torch.bool)
                                                                  for t in LENGTHS[:3]])
    got = hoca_attention(small, 0, torch.ones(5, 4, dtype=F64), max_elements=needed)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("samples_per_chunk", [1, 2, 4])
def test_a_batch_larger_than_the_bound_runs_in_chunks_with_the_same_values(samples_per_chunk):
    """The bound is per sample: B x (one sample) > max_elements is split, not refused."""
    features, _, masks = random_problem(3, batch=5, dim=3, seed=7)
    gen = generator(8)
    weights = [torch.randn(non_target(LENGTHS[:3], t), generator=gen, dtype=F64) for t in range(3)]
    per_sample = 3 * 5 * 4 + 3 * 3 * 4  # T_0 T_1 T_2 + d T_0 T_2
    bound = samples_per_chunk * per_sample + per_sample - 1  # fits samples_per_chunk, not more
    unchunked_all = hoca_attention_all_targets(features, weights, masks)
    chunked_all = hoca_attention_all_targets(features, weights, masks, max_elements=bound)
    for target in range(3):
        expected = loop_hoca(features, target, weights[target], masks)  # Eq. 9 by loops
        chunked = hoca_attention(features, target, weights[target], masks, max_elements=bound)
        torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(chunked_all[target], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(chunked_all[target], unchunked_all[target], rtol=0, atol=1e-14)
    correlation = high_order_correlation(features, masks, max_elements=bound)
    assert correlation.shape == (5, *LENGTHS[:3])
    for b in range(5):
        for index in itertools.product(*[range(t) for t in LENGTHS[:3]]):
            entry = loop_correlation_entry(features, masks, b, index)  # Eq. 7
            assert abs(float(correlation[(b, *index)]) - entry) < 1e-12


def test_evaluation_batch_of_256_is_not_refused_when_each_sample_fits():
    gen = generator(9)
    features = [torch.randn(256, 12, 4, generator=gen, dtype=F64) for _ in range(3)]
    weight = torch.randn(12, 12, generator=gen, dtype=F64)
    per_sample = 12**3 + 4 * 12**2
    attention = hoca_attention(features, 1, weight, max_elements=40 * per_sample)  # 256 > 40
    masks = [torch.ones(1, 12, dtype=torch.bool)] * 3
    for b in (0, 39, 40, 255):  # first and last sample of a chunk, and the final one
        sample = [x[b : b + 1] for x in features]
        torch.testing.assert_close(
            attention[b], loop_hoca(sample, 1, weight, masks)[0], rtol=0, atol=1e-12
        )


# ---------------------------------------------------------------------------
# Low-Rank HOCA, Eq. 14 to 17, and the identity with HOCA
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4])
def test_low_rank_attention_matches_loops(n):
    features, factors, masks = random_problem(n, batch=2, dim=3, seed=30 + n)
    weight_vector = torch.randn(3, generator=generator(40 + n), dtype=F64)
    for target in range(n):
        attention = low_rank_hoca_attention(features, target, factors, weight_vector, masks)
        expected = loop_low_rank(features, target, factors, weight_vector, masks)
        torch.testing.assert_close(attention, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_low_rank_with_ones_equals_hoca_with_cp_weight(n):
    """README note 9: w^{I_l} = 1_d makes Low-Rank HOCA exactly HOCA with the CP weight."""
    features, factors, masks = random_problem(n, batch=4, dim=5, rank=3, seed=50 + n)
    ones = torch.ones(5, dtype=F64)
    weights = [cp_weight_tensor(non_target(factors, target)) for target in range(n)]
    for target in range(n):
        exact = hoca_attention(features, target, weights[target], masks)
        low_rank = low_rank_hoca_attention(features, target, factors, ones, masks)
        torch.testing.assert_close(low_rank, exact, rtol=0, atol=1e-10)
        # the attention is not trivially uniform, so the comparison has teeth
        assert float((exact - exact.mean(-1, keepdim=True)).abs().max()) > 1e-3
    exact_all = hoca_attention_all_targets(features, weights, masks)
    low_rank_all = low_rank_hoca_attention_all_targets(features, factors, [ones] * n, masks)
    for a, b in zip(exact_all, low_rank_all, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    # a weight vector other than 1_d is a different attention
    other = low_rank_hoca_attention(
        features, 0, factors, ones * torch.linspace(-1, 2, 5, dtype=F64), masks
    )
    assert float((other - exact_all[0]).abs().max()) > 1e-6


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_targets_match_the_loops_for_every_target(n):
    """One shared correlation tensor (exact) and shared factors with prefix/suffix
    products (low rank) give every target its Eq. 9 / Eq. 17 attention."""
    features, factors, masks = random_problem(n, dim=3, seed=60 + n)
    gen = generator(70 + n)
    weights = [torch.randn(non_target(LENGTHS[:n], t), generator=gen, dtype=F64) for t in range(n)]
    vectors = [torch.randn(3, generator=gen, dtype=F64) for _ in range(n)]
    exact_all = hoca_attention_all_targets(features, weights, masks)
    low_rank_all = low_rank_hoca_attention_all_targets(features, factors, vectors, masks)
    assert len(exact_all) == len(low_rank_all) == n
    for target in range(n):
        torch.testing.assert_close(
            exact_all[target], loop_hoca(features, target, weights[target], masks),
            rtol=0, atol=1e-12,
        )
        torch.testing.assert_close(
            low_rank_all[target],
            loop_low_rank(features, target, factors, vectors[target], masks),
            rtol=0, atol=1e-12,
        )


# ---------------------------------------------------------------------------
# Masks: normalisation, zero attention, padded content changes nothing
# ---------------------------------------------------------------------------


def all_attentions(features, factors, masks, weights, vectors):
    n = len(features)
    return [
        *hoca_attention_all_targets(features, weights, masks),
        *low_rank_hoca_attention_all_targets(features, factors, vectors, masks),
        *[hoca_attention(features, t, weights[t], masks) for t in range(n)],
        *[low_rank_hoca_attention(features, t, factors, vectors[t], masks) for t in range(n)],
    ]


def test_attention_sums_to_one_over_real_steps_and_is_zero_at_padding():
    features, factors, masks = random_problem(3, batch=5, seed=80)
    gen = generator(81)
    weights = [torch.randn(non_target(LENGTHS[:3], t), generator=gen, dtype=F64) for t in range(3)]
    vectors = [torch.randn(4, generator=gen, dtype=F64) for _ in range(3)]
    attentions = all_attentions(features, factors, masks, weights, vectors)
    for k, attention in enumerate(attentions):
        mask = masks[k % 3]
        torch.testing.assert_close(attention.sum(-1), torch.ones(5, dtype=F64), rtol=0, atol=1e-12)
        assert bool((attention[~mask] == 0).all())
        assert bool((attention[mask] > 0).all())


def test_padded_content_and_extra_padding_change_nothing():
    features, factors, masks = random_problem(3, batch=4, seed=90)
    gen = generator(91)
    weights = [torch.randn(non_target(LENGTHS[:3], t), generator=gen, dtype=F64) for t in range(3)]
    vectors = [torch.randn(4, generator=gen, dtype=F64) for _ in range(3)]
    reference = all_attentions(features, factors, masks, weights, vectors)

    # 1. garbage (NaN, huge values) at padded steps
    poisoned = []
    for i, (x, mask) in enumerate(zip(features, masks, strict=True)):
        x = x.clone()
        x[~mask] = float("nan") if i % 2 == 0 else 1e30
        poisoned.append(x)
    for got, expected in zip(
        all_attentions(poisoned, factors, masks, weights, vectors), reference, strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)

    # 2. two more padded steps per modality, with random weights and factors there
    extra = 2
    longer = [
        torch.cat([x, torch.randn(4, extra, 4, generator=gen, dtype=F64)], 1) for x in features
    ]
    longer_masks = [torch.cat([m, torch.zeros(4, extra, dtype=torch.bool)], 1) for m in masks]
    longer_factors = [
        torch.cat([f, torch.randn(3, extra, generator=gen, dtype=F64)], 1) for f in factors
    ]
    longer_weights = []
    for weight in weights:
        big = torch.randn([s + extra for s in weight.shape], generator=gen, dtype=F64)
        big[tuple(slice(0, s) for s in weight.shape)] = weight
        longer_weights.append(big)
    for got, expected in zip(
        all_attentions(longer, longer_factors, longer_masks, longer_weights, vectors),
        reference,
        strict=True,
    ):
        torch.testing.assert_close(got[:, : expected.shape[1]], expected, rtol=0, atol=1e-12)
        assert bool((got[:, expected.shape[1] :] == 0).all())

    # 3. the masks matter: treating padding as real changes the attention
    unmasked = all_attentions(features, factors, None, weights, vectors)
    assert max(float((a - b).abs().max()) for a, b in zip(unmasked, reference, strict=True)) > 1e-3


# ---------------------------------------------------------------------------
# Gradients (float64 gradcheck for every functional op)
# ---------------------------------------------------------------------------


def small_inputs(seed, n=3, requires_grad=True):
    gen = generator(seed)
    lengths = [2, 3, 2][:n]
    features = [
        torch.randn(2, t, 3, generator=gen, dtype=F64, requires_grad=requires_grad) for t in lengths
    ]
    masks = [torch.tensor([[True] * t, [True] + [False] * (t - 1)]) for t in lengths]
    factors = [
        torch.randn(2, t, generator=gen, dtype=F64, requires_grad=requires_grad) for t in lengths
    ]
    return features, masks, factors, gen


def test_gradcheck_bahdanau_and_mapping():
    gen = generator(100)
    query = torch.randn(2, 3, generator=gen, dtype=F64, requires_grad=True)
    features = torch.randn(2, 4, 2, generator=gen, dtype=F64, requires_grad=True)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    p = {k: v.requires_grad_() for k, v in bahdanau_parameters(gen, 3, 2, 3).items()}

    def unary(q, x, qw, fw, sv, bias):
        return bahdanau_attention(
            q, x, mask, query_weight=qw, feature_weight=fw, score_vector=sv, bias=bias
        )

    def mapping(q, x, qw, fw, bias):
        return query_conditioned_features(q, x, query_weight=qw, feature_weight=fw, bias=bias)

    args = (query, features, p["query_weight"], p["feature_weight"], p["score_vector"], p["bias"])
    assert gradcheck(unary, args)
    assert gradcheck(mapping, (query, features, p["query_weight"], p["feature_weight"], p["bias"]))


def test_gradcheck_exact_hoca():
    features, masks, factors, gen = small_inputs(101)
    weight = torch.randn(2, 2, generator=gen, dtype=F64, requires_grad=True)  # target 1
    weights = [
        torch.randn(non_target([2, 3, 2], t), generator=gen, dtype=F64, requires_grad=True)
        for t in range(3)
    ]
    assert gradcheck(lambda *x: high_order_correlation(list(x), masks), tuple(features))
    assert gradcheck(lambda w, *x: hoca_attention(list(x), 1, w, masks), (weight, *features))
    assert gradcheck(
        lambda *args: hoca_attention_all_targets(list(args[:3]), list(args[3:]), masks),
        (*features, *weights),
    )
    assert gradcheck(lambda *f: cp_weight_tensor(list(f)), tuple(factors))


def test_gradcheck_low_rank_hoca():
    features, masks, factors, gen = small_inputs(102)
    vector = torch.randn(3, generator=gen, dtype=F64, requires_grad=True)
    vectors = [torch.randn(3, generator=gen, dtype=F64, requires_grad=True) for _ in range(3)]
    assert gradcheck(
        lambda v, *args: low_rank_hoca_attention(list(args[:3]), 2, list(args[3:]), v, masks),
        (vector, *features, *factors),
    )
    assert gradcheck(
        lambda *args: low_rank_hoca_attention_all_targets(
            list(args[:3]), list(args[3:6]), list(args[6:]), masks
        ),
        (*features, *factors, *vectors),
    )


# ---------------------------------------------------------------------------
# Scale and validation
# ---------------------------------------------------------------------------


def test_low_rank_handles_eight_modalities_of_length_100_quickly():
    gen = generator(110)
    features = [torch.randn(2, 100, 8, generator=gen, dtype=F64) for _ in range(8)]
    masks = [torch.arange(100)[None, :] < torch.tensor([100, 37])[:, None] for _ in range(8)]
    factors = [torch.randn(2, 100, generator=gen, dtype=F64) / 10 for _ in range(8)]
    vectors = [torch.randn(8, generator=gen, dtype=F64) for _ in range(8)]
    start = time.perf_counter()
    attentions = low_rank_hoca_attention_all_targets(features, factors, vectors, masks)
    single = low_rank_hoca_attention(features, 5, factors, vectors[5], masks)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed  # linear cost: milliseconds in practice
    for target in (0, 5):  # Eq. 14-17 by loops over 7 other modalities of 100 steps
        expected = loop_low_rank(features, target, factors, vectors[target], masks)
        torch.testing.assert_close(attentions[target], expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(single, attentions[5], rtol=0, atol=1e-12)


def test_low_rank_matmul_cost_is_linear_in_the_number_of_modalities():
    """FLOPs of the contractions (Eq. 14, 17) double with n; the exact tensor would not."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(n):
        gen = generator(120 + n)
        features = [torch.randn(2, 50, 16, generator=gen) for _ in range(n)]
        factors = [torch.randn(2, 50, generator=gen) for _ in range(n)]
        with FlopCounterMode(display=False) as counter:
            low_rank_hoca_attention_all_targets(features, factors, [torch.ones(16)] * n)
        return counter.get_total_flops()

    assert flops(8) == 2 * flops(4) == 4 * flops(2) > 0


def test_errors_name_the_modality_and_the_problem():
    features, factors, masks = random_problem(3)
    with pytest.raises(ValueError, match=r"T_i for every modality i != 1.*expected \(3, 4\)"):
        hoca_attention(features, 1, torch.ones(3, 5, dtype=F64), masks)
    with pytest.raises(ValueError, match="target must be a modality index"):
        hoca_attention(features, 3, torch.ones(3, 5, dtype=F64))
    with pytest.raises(ValueError, match=r"modality 2.*same common size d"):
        hoca_attention(
            [features[0], features[1], features[2][..., :2]], 0, torch.ones(5, 4, dtype=F64)
        )
    with pytest.raises(ValueError, match=r"factors\[1\] \(modality 1"):
        low_rank_hoca_attention(
            features, 0, [None, factors[1][:, :2], factors[2]], torch.ones(4, dtype=F64)
        )
    with pytest.raises(ValueError, match=r"weight_vector \(d,\)"):
        low_rank_hoca_attention(features, 0, factors, torch.ones(3, dtype=F64))
    empty = [m.clone() for m in masks]
    empty[2][1] = False
    with pytest.raises(ValueError, match=r"modality 2\) is all padding for sample"):
        low_rank_hoca_attention(features, 0, factors, torch.ones(4, dtype=F64), empty)
    bad = [x.clone() for x in features]
    bad[1][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"modality 1\) contains NaN"):
        high_order_correlation(bad)
    with pytest.raises(ValueError, match="at least 2"):
        hoca_attention(features[:1], 0, torch.ones(()))


def _validation_cases():
    """(call, message pattern): every check of the module, each error naming its caller."""
    features, factors, masks = random_problem(3)
    ones = torch.ones(4, dtype=F64)
    weights = [torch.ones(non_target(LENGTHS[:3], t), dtype=F64) for t in range(3)]
    nan = [x.clone() for x in features]
    nan[1][0, 0, 0] = float("nan")
    query = torch.ones(3, 2, dtype=F64)
    unary = {"query_weight": torch.ones(5, 2, dtype=F64), "feature_weight": torch.ones(5, 4,
             dtype=F64), "score_vector": torch.ones(5, dtype=F64)}
    return [
        (lambda: high_order_correlation(nan), r"^high_order_correlation features\[1\] \(modality 1\) contains NaN"),
        (lambda: hoca_attention(nan, 0, weights[0]), r"^hoca_attention features\[1\] \(modality 1\) contains NaN"),
        (lambda: hoca_attention_all_targets(nan, weights), r"^hoca_attention features\[1\]"),
        (lambda: low_rank_hoca_attention(nan, 0, factors, ones), r"^low_rank_hoca_attention features\[1\]"),
        (lambda: low_rank_hoca_attention_all_targets(nan, factors, [ones] * 3), r"^low_rank_hoca_attention features\[1\]"),
        (lambda: bahdanau_attention(query, nan[1], None, **unary), r"^bahdanau_attention features\[0\] \(modality 0\) contains NaN"),
        (lambda: high_order_correlation(features, max_elements=10), r"^high_order_correlation: the exact HOCA correlation tensor of one sample \(T_1 x \.\.\. x T_n = 3 x 5 x 4\) needs 108 elements \(60 for the tensor, 48 for"),
        (lambda: hoca_attention(features, 0, weights[0], max_elements=10), r"^hoca_attention: the exact"),
        (lambda: hoca_attention_all_targets(features, weights, max_elements=10), r"^hoca_attention_all_targets: the exact"),
        (lambda: hoca_attention_all_targets(features, weights[:2]), r"^hoca_attention weights: expected exactly 3 modalities, got 2"),
        (lambda: hoca_attention_all_targets(features, [*weights, weights[0]]), r"^hoca_attention weights: expected exactly 3 modalities, got 4"),
        (lambda: hoca_attention_all_targets(features, [weights[0], weights[0], weights[2]]), r"^hoca_attention weights\[1\] \(T_i for every modality i != 1\) has shape \(5, 4\), expected \(3, 4\)"),
        (lambda: hoca_attention(features, 0, weights[0].float()), r"^hoca_attention weight \(T_i for every modality i != 0\) has dtype torch.float32, the features have torch.float64"),
        (lambda: hoca_attention(features, 0, [[1.0]]), r"^hoca_attention weight .* must be a tensor, got list"),
        (lambda: hoca_attention(features, True, weights[0]), r"^target must be a modality index in \[0, 2\], got True"),
        (lambda: hoca_attention(features, -1, weights[0]), r"^target must be a modality index in \[0, 2\], got -1"),
        (lambda: hoca_attention(features, 1.0, weights[1]), r"^target must be a modality index"),
        (lambda: hoca_attention([features[0][0], *features[1:]], 0, weights[0]), r"^hoca_attention features\[0\] \(modality 0\) has shape \(3, 4\); expected \(B, T_0, d\)"),
        (lambda: hoca_attention([features[0], features[1].int(), features[2]], 0, weights[0]), r"^hoca_attention features\[1\] \(modality 1\) has dtype torch.int32; expected a float"),
        (lambda: hoca_attention([features[0], features[1][:2], features[2]], 0, weights[0]), r"^hoca_attention features\[1\] \(modality 1\) has shape \(2, 5, 4\), modality 0 has \(3, 3, 4\): all modalities need the same batch size"),
        (lambda: hoca_attention([features[0], features[1].float(), features[2]], 0, weights[0]), r"^hoca_attention features\[1\] \(modality 1\) has dtype torch.float32, modality 0 has torch.float64"),
        (lambda: hoca_attention([features[0], features[1][:, :0], features[2]], 0, torch.ones(0, 4, dtype=F64)), r"^hoca_attention features\[1\] \(modality 1\) is an empty sequence \(T = 0\)"),
        (lambda: hoca_attention(features, 0, weights[0], [masks[0], masks[1][:, :2], masks[2]]), r"hoca_attention features masks\[1\]"),
        (lambda: low_rank_hoca_attention(features, 0, factors[0], ones), r"^factors must be a list of 3 tensors \(k, T_i\), one per modality"),
        (lambda: low_rank_hoca_attention(features, 0, factors[:2], ones), r"^factors must be a list of 3 tensors"),
        (lambda: low_rank_hoca_attention(features, 0, [None, factors[1][0], factors[2]], ones), r"^factors\[1\] \(modality 1\) must be a \(k, T_1\) tensor"),
        (lambda: low_rank_hoca_attention(features, 0, [None, factors[1], factors[2][:2]], ones), r"^factors\[2\] \(modality 2, \(k, T_2\)\) has shape \(2, 4\), expected \(3, 4\)"),
        (lambda: low_rank_hoca_attention_all_targets(features, [None, *factors[1:]], [ones] * 3), r"^factors\[0\] \(modality 0\) must be"),
        (lambda: low_rank_hoca_attention_all_targets(features, factors, [ones] * 2), r"^weight_vectors: expected exactly 3 modalities, got 2"),
        (lambda: low_rank_hoca_attention_all_targets(features, factors, [ones] * 4), r"^weight_vectors: expected exactly 3 modalities, got 4"),
        (lambda: low_rank_hoca_attention_all_targets(features, factors, [ones, ones[:3], ones]), r"^weight_vectors\[1\] \(d,\) has shape \(3,\), expected \(4,\)"),
        (lambda: cp_weight_tensor([]), r"^cp_weight_tensor factors: expected at least 1 modalities, got 0"),
        (lambda: cp_weight_tensor([factors[0], factors[1][:2]]), r"^cp_weight_tensor factors\[1\] has shape \(2, 5\); expected \(k, T_1\) with the rank k = 3"),
        (lambda: cp_weight_tensor([factors[0], factors[1][0]]), r"^cp_weight_tensor factors\[1\] has shape \(5,\)"),
        (lambda: bahdanau_attention(query[:2], features[0], None, **unary), r"^query has shape \(2, 2\); expected \(B, d_q\) with B = 3"),
        (lambda: bahdanau_attention(query[:, None], features[0], None, **unary), r"^query has shape \(3, 1, 2\)"),
        (lambda: query_conditioned_features(query[:2], features[0], query_weight=unary["query_weight"], feature_weight=unary["feature_weight"]), r"^query must be \(B, d_q\) and features \(B, T, d_f\) with the same B, got \(2, 2\) and \(3, 3, 4\)"),
        (lambda: query_conditioned_features(query[0], features[0], query_weight=unary["query_weight"], feature_weight=unary["feature_weight"]), r"^query must be \(B, d_q\)"),
        (lambda: query_conditioned_features(query, features[0][0], query_weight=unary["query_weight"], feature_weight=unary["feature_weight"]), r"^query must be \(B, d_q\)"),
        (lambda: hoca_attention(features[:1], 0, weights[0]), r"^hoca_attention features: expected at least 2 modalities, got 1"),
        (lambda: high_order_correlation(features[:2], max_elements=10), r"needs 15 elements \(15 for the tensor, 0 for the intermediate product\)"),
        (lambda: low_rank_hoca_attention(features, 0, dict(enumerate(factors)), ones), r"^factors must be a list of 3 tensors"),
        (lambda: low_rank_hoca_attention(features, 0, factors, ones[:3]), r"^weight_vector \(d,\) has shape \(3,\), expected \(4,\)"),
    ]


def test_every_check_names_its_caller_and_the_problem():
    cases = _validation_cases()
    assert len(cases) == 43
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
