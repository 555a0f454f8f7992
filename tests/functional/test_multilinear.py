"""Multi-linear attention against independent oracles: loops over all tuples of time
steps, the brute-force tuple tensor of the random features, the papers' identities."""

import itertools
import math
import re

import pytest
import torch

import polyfuse.functional as F
from polyfuse._checks import validation

DOUBLE = torch.float64


def make_inputs(lengths, feature_dim=4, value_dim=3, batch=2, scale=0.4, seed=0, dtype=DOUBLE):
    generator = torch.Generator().manual_seed(seed)
    features = [torch.randn(batch, t, feature_dim, generator=generator, dtype=dtype) * scale for t in lengths]
    values = [torch.randn(batch, t, value_dim, generator=generator, dtype=dtype) for t in lengths]
    return features, values


def make_masks(lengths, batch=2, seed=1):
    """Random masks with at least one real step per sample and modality."""
    generator = torch.Generator().manual_seed(seed)
    masks = []
    for t in lengths:
        mask = torch.rand(batch, t, generator=generator) > 0.4
        mask[:, 0] = True
        masks.append(mask)
    return masks


def tuples(features, masks, b):
    lengths = [a.shape[1] for a in features]
    for index in itertools.product(*(range(t) for t in lengths)):
        if masks is None or all(bool(masks[j][b, t]) for j, t in enumerate(index)):
            yield index


def loop_attention(features, values, masks, logit_of_tuple):
    """Plain-Python MAN Eq. 5: a softmax over every real tuple of steps."""
    batch = features[0].shape[0]
    outputs = []
    for b in range(batch):
        index_list = list(tuples(features, masks, b))
        logits = torch.stack([logit_of_tuple(b, index) for index in index_list])
        weights = torch.softmax(logits, dim=0)
        total = torch.zeros(values[0].shape[-1], dtype=values[0].dtype)
        for weight, index in zip(weights, index_list, strict=True):
            product = torch.ones_like(total)
            for j, t in enumerate(index):
                product = product * values[j][b, t]
            total = total + weight * product
        outputs.append(total)
    return torch.stack(outputs)


def cao_logit(features, temperature=1.0):
    def logit(b, index):
        total = torch.zeros((), dtype=features[0].dtype)
        for j, k in itertools.combinations(range(len(index)), 2):  # unordered pairs: note 1
            total = total + features[j][b, index[j]] @ features[k][b, index[k]]
        return temperature * total

    return logit


def hadamard_logit(features, temperature=1.0):
    def logit(b, index):
        product = torch.ones(features[0].shape[-1], dtype=features[0].dtype)
        for j, t in enumerate(index):
            product = product * features[j][b, t]
        return temperature * product.sum()

    return logit


LENGTH_CASES = [(3, 5), (2, 4, 3), (2, 3, 2, 4)]


@pytest.mark.parametrize("lengths", LENGTH_CASES)
@pytest.mark.parametrize("with_masks", [False, True])
def test_exact_matches_loops_over_all_tuples(lengths, with_masks):
    features, values = make_inputs(lengths)
    masks = make_masks(lengths) if with_masks else None
    expected = loop_attention(features, values, masks, cao_logit(features, 0.7))
    actual = F.multilinear_attention(features, values, masks, mode="exact", temperature=0.7)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lengths", LENGTH_CASES)
def test_hadamard_matches_loops_over_all_tuples(lengths):
    features, values = make_inputs(lengths)
    masks = make_masks(lengths)
    expected = loop_attention(features, values, masks, hadamard_logit(features))
    actual = F.multilinear_attention(features, values, masks, mode="hadamard")
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def test_hadamard_mode_applies_the_temperature():
    """Kills the mutant that drops the temperature in hadamard mode: the logits of a
    temperature of 0.3 and of 1 give different outputs, each equal to the loops'."""
    lengths = (2, 4, 3)
    features, values = make_inputs(lengths, scale=1.5)
    masks = make_masks(lengths)
    for temperature in (0.3, 2.5):
        expected = loop_attention(features, values, masks, hadamard_logit(features, temperature))
        actual = F.multilinear_attention(features, values, masks, mode="hadamard", temperature=temperature)
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    untempered = loop_attention(features, values, masks, hadamard_logit(features))
    assert (untempered - expected).abs().max() > 1e-2


def test_exact_attention_tensor_is_a_distribution_over_real_tuples():
    lengths = (3, 4, 2)
    features, values = make_inputs(lengths)
    masks = make_masks(lengths)
    _, attention = F.multilinear_attention(features, values, masks, mode="exact", return_attention=True)
    assert attention.shape == (2, *lengths)
    torch.testing.assert_close(attention.sum((1, 2, 3)), torch.ones(2, dtype=DOUBLE))
    for b in range(2):
        real = torch.zeros(lengths, dtype=torch.bool)
        for index in tuples(features, masks, b):
            real[index] = True
        assert torch.all(attention[b][~real] == 0)
        assert torch.all(attention[b][real] > 0)


def brute_force_had(features, values, masks, random_features, temperature=1.0):
    """(estimator="arf") MAN Eq. 9, 10, 12 by building the full tuple tensor A[t] = sum_h prod_j B_j[t_j, h]
    from unstabilised positive random features, then normalising."""
    scale = math.sqrt(temperature)
    batch = features[0].shape[0]
    outputs, marginals = [], [[] for _ in features]
    for b in range(batch):
        phi = []
        for a in features:
            x = a[b] * scale
            phi.append(torch.exp(x @ random_features.T - 0.5 * (x * x).sum(-1, keepdim=True)))
        lengths = [a.shape[1] for a in features]
        tensor = torch.zeros(lengths, dtype=features[0].dtype)
        for index in tuples(features, masks, b):
            product = torch.ones(random_features.shape[0], dtype=features[0].dtype)
            for j, t in enumerate(index):
                product = product * phi[j][t]
            tensor[index] = product.sum()  # Eq. 9: 1^T prod_j B_{j, t_j}
        attention = tensor / tensor.sum()  # Eq. 12 normalisation
        total = torch.zeros(values[0].shape[-1], dtype=values[0].dtype)
        for index in tuples(features, masks, b):
            product = torch.ones_like(total)
            for j, t in enumerate(index):
                product = product * values[j][b, t]
            total = total + attention[index] * product
        outputs.append(total)
        for j in range(len(features)):
            other_axes = tuple(i for i in range(len(features)) if i != j)
            marginals[j].append(attention.sum(other_axes))
    return torch.stack(outputs), [torch.stack(m) for m in marginals]


@pytest.mark.parametrize("lengths", LENGTH_CASES)
@pytest.mark.parametrize("with_masks", [False, True])
def test_had_equals_brute_force_tuple_tensor(lengths, with_masks):
    features, values = make_inputs(lengths)
    masks = make_masks(lengths) if with_masks else None
    generator = torch.Generator().manual_seed(3)
    random_features = F.gaussian_random_matrix(7, 4, orthogonal=False, generator=generator, dtype=DOUBLE)
    expected, expected_marginals = brute_force_had(features, values, masks, random_features, 0.5)
    actual, marginals = F.multilinear_attention(
        features, values, masks, mode="had", random_matrix=random_features,
        temperature=0.5, return_attention=True, estimator="arf",
    )
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    for marginal, expected_marginal in zip(marginals, expected_marginals, strict=True):
        torch.testing.assert_close(marginal, expected_marginal, rtol=1e-10, atol=1e-10)


def had_error(features, values, exact, num_features, orthogonal, seed, estimator="gerf"):
    generator = torch.Generator().manual_seed(seed)
    random_features = F.gaussian_random_matrix(
        num_features, features[0].shape[-1], orthogonal=orthogonal, generator=generator, dtype=DOUBLE
    )
    estimate = F.multilinear_attention(features, values, mode="had", random_matrix=random_features,
                                       estimator=estimator)
    return (estimate - exact).pow(2).sum().item()


@pytest.mark.parametrize("estimator", ["gerf", "arf"])
def test_had_converges_to_exact_as_random_features_grow(estimator):
    features, values = make_inputs((4, 5, 3), feature_dim=6, scale=0.2)
    exact = F.multilinear_attention(features, values, mode="exact")
    errors = []
    for num_features in (32, 256, 2048):
        errors.append(sum(had_error(features, values, exact, num_features, False, seed, estimator)
                          for seed in range(20)) / 20)
    # The mean squared error falls like 1/H: 8 times more features, about 8 times less error.
    assert errors[1] < errors[0] / 4 and errors[2] < errors[1] / 4
    assert errors[2] < 0.05 * exact.pow(2).sum().item()  # within a few percent at H = 2048


def random_unit_vectors(count, dim, norm, generator):
    vectors = torch.randn(count, dim, generator=generator, dtype=DOUBLE)
    return norm * vectors / vectors.norm(dim=-1, keepdim=True)


def kernel_estimates(vectors, num_features, orthogonal, draws, generator):
    """`draws` independent H-feature estimates of SM({v_j}) = exp(sum_{j<k} v_j . v_k):
    (1/H) sum_h prod_j phi(v_j)_h (MAN Eq. 11)."""
    estimates = []
    for _ in range(draws):
        random_features = F.gaussian_random_matrix(
            num_features, vectors.shape[-1], orthogonal=orthogonal, generator=generator, dtype=DOUBLE
        )
        estimates.append(F.positive_random_features(vectors, random_features).prod(0).mean())
    return torch.stack(estimates)


def test_orthogonal_features_do_no_worse_than_iid_on_average():
    generator = torch.Generator().manual_seed(0)
    vectors = random_unit_vectors(3, 8, 0.4, generator)
    exact = math.exp(sum(float(vectors[j] @ vectors[k]) for j, k in itertools.combinations(range(3), 2)))
    for num_features in (4, 8, 24):  # H < K', H = K' and H > K' (blockwise orthogonal)
        iid = (kernel_estimates(vectors, num_features, False, 4000, generator) - exact).pow(2).mean()
        orthogonal = (kernel_estimates(vectors, num_features, True, 4000, generator) - exact).pow(2).mean()
        assert orthogonal <= iid * 1.02


@pytest.mark.parametrize("num_features", [16, 64, 256])
def test_arf_mean_squared_error_matches_appendix_eq_12(num_features):
    """Appendix Eq. 12 / note 4: MSE = exp(|z|^2) SM^2 (1 - exp(-|z|^2)) / H for i.i.d. rows.

    The estimator is heavy-tailed (its fourth moment grows like exp(6 |z|^2)), so the
    Monte Carlo check uses vectors of norm 0.6 (|z|^2 about 1.5 here), where 40000
    draws pin the mean squared error down to a few percent.
    """
    generator = torch.Generator().manual_seed(0)
    vectors = random_unit_vectors(3, 8, 0.6, generator)
    z = vectors.sum(0)
    exact = math.exp(sum(float(vectors[j] @ vectors[k]) for j, k in itertools.combinations(range(3), 2)))
    squared_errors, means = [], []
    for _ in range(8):  # 8 chunks of 5000 draws keep memory small
        random_features = torch.randn(5000, num_features, 8, generator=generator, dtype=DOUBLE)
        phi = F.positive_random_features(vectors.unsqueeze(0), random_features)  # (draws, 3, H)
        estimates = phi.prod(dim=1).mean(dim=-1)  # (1/H) sum_h prod_j phi_j[h]
        squared_errors.append((estimates - exact).pow(2))
        means.append(estimates)
    measured = torch.cat(squared_errors).mean().item()
    z2 = float(z @ z)
    predicted = math.exp(z2) * exact**2 * (1 - math.exp(-z2)) / num_features
    assert abs(torch.cat(means).mean().item() - exact) < 0.01 * exact  # unbiased
    assert abs(measured - predicted) <= 0.15 * predicted


def unstabilised_had(features, values, random_features):
    """Eq. 10 / Eq. 12 computed literally, with no stabilisation (may overflow)."""
    numerator, denominator = None, None
    for a, v in zip(features, values, strict=True):
        phi = torch.exp(a @ random_features.T - 0.5 * (a * a).sum(-1, keepdim=True))  # (B, T, H)
        contracted = torch.einsum("bth,btk->bhk", phi, v)
        sums = phi.sum(1)
        numerator = contracted if numerator is None else numerator * contracted
        denominator = sums if denominator is None else denominator * sums
    return numerator.sum(1) / denominator.sum(1, keepdim=True)


SCALE_F32_UNDERFLOW = 9.0


def test_large_inputs_stay_finite_and_match_the_unstabilised_formula():
    generator = torch.Generator().manual_seed(5)
    random_features = F.gaussian_random_matrix(16, 4, orthogonal=True, generator=generator, dtype=DOUBLE)
    # At this scale the literal formula underflows to 0 / 0 in float32 but not in float64.
    features, values = make_inputs((3, 4, 5), scale=SCALE_F32_UNDERFLOW)
    reference = unstabilised_had(features, values, random_features)
    assert torch.isfinite(reference).all()
    single = [a.float() for a in features], [v.float() for v in values]
    assert not torch.isfinite(unstabilised_had(*single, random_features.float())).all()
    stable32 = F.multilinear_attention(*single, mode="had", random_matrix=random_features.float(),
                                       estimator="arf")
    torch.testing.assert_close(stable32.double(), reference, rtol=1e-3, atol=1e-4)
    # Inputs scaled by 100: finite in both precisions, and equal to the literal
    # formula wherever that is finite.
    features, values = make_inputs((3, 4, 5), scale=0.4 * 100)
    stable64 = F.multilinear_attention(features, values, mode="had", random_matrix=random_features,
                                       estimator="arf")
    stable32 = F.multilinear_attention(
        [a.float() for a in features], [v.float() for v in values], mode="had",
        random_matrix=random_features.float(), estimator="arf",
    )
    assert torch.isfinite(stable64).all() and torch.isfinite(stable32).all()
    literal = unstabilised_had(features, values, random_features)
    finite = torch.isfinite(literal)
    torch.testing.assert_close(stable64[finite], literal[finite], rtol=1e-8, atol=1e-8)
    exact = F.multilinear_attention(
        [a.float() for a in features], [v.float() for v in values], mode="exact"
    )
    assert torch.isfinite(exact).all()


@pytest.mark.parametrize("mode", ["exact", "hadamard", "had"])
def test_padded_content_changes_nothing(mode):
    lengths = (3, 5, 4)
    features, values = make_inputs(lengths)
    masks = make_masks(lengths)
    random_features = torch.randn(9, 4, dtype=DOUBLE, generator=torch.Generator().manual_seed(0))
    out = F.multilinear_attention(features, values, masks, mode=mode, random_matrix=random_features)
    noisy_features = [a.masked_fill(~m.unsqueeze(-1), float("nan")) for a, m in zip(features, masks, strict=True)]
    noisy_values = [v + 1e6 * (~m).unsqueeze(-1) for v, m in zip(values, masks, strict=True)]
    noisy = F.multilinear_attention(noisy_features, noisy_values, masks, mode=mode, random_matrix=random_features)
    torch.testing.assert_close(noisy, out, rtol=0, atol=0)


def test_all_padding_sample_is_a_clear_error():
    features, values = make_inputs((3, 4))
    masks = [torch.ones(2, 3, dtype=torch.bool), torch.tensor([[True] * 4, [False] * 4])]
    with pytest.raises(ValueError, match=r"modality 1\) is all padding for sample\(s\) \[1\]"):
        F.multilinear_attention(features, values, masks, mode="exact")


def test_bad_input_errors_name_the_modality():
    features, values = make_inputs((3, 4, 2))
    with pytest.raises(ValueError, match="at least 2 modalities"):
        F.multilinear_attention(features[:1], values[:1], mode="exact")
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        F.multilinear_attention(features, values, mode="fast")
    bad = [features[0], features[1][..., :3], features[2]]
    with pytest.raises(ValueError, match=r"features\[1\] \(modality 1\)"):
        F.multilinear_attention(bad, values, mode="exact")
    bad = [values[0], values[1], values[2][:, :1]]
    with pytest.raises(ValueError, match=r"values\[2\] \(modality 2\)"):
        F.multilinear_attention(features, bad, mode="exact")
    bad = [features[0], features[1].clone(), features[2]]
    bad[1][1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"features\[1\] \(modality 1\) contains NaN at index \(1, 2, 0\)"):
        F.multilinear_attention(bad, values, mode="exact")
    bad = [values[0].clone(), values[1], values[2]]
    bad[0][0, 0, 1] = float("inf")
    with pytest.raises(ValueError, match=r"values\[0\] \(modality 0\) contains Inf"):
        F.multilinear_attention(features, bad, mode="had", random_matrix=torch.randn(4, 4, dtype=DOUBLE))
    with pytest.raises(ValueError, match="needs random_matrix"):
        F.multilinear_attention(features, values, mode="had")
    with pytest.raises(ValueError, match="batch dims"):
        F.multilinear_attention(
            [features[0][:1].expand(3, -1, -1), *features[1:]], [values[0][:1].expand(3, -1, -1), *values[1:]],
            mode="exact",
        )
    with pytest.raises(ValueError, match=r"masks\[1\] \(modality 1\) has shape"):
        F.multilinear_attention(features, values, [None, torch.ones(2, 3, dtype=torch.bool), None], mode="exact")


@pytest.mark.parametrize("mode", ["exact", "hadamard", "had"])
def test_gradcheck_multilinear_attention(mode):
    lengths = (2, 3, 2)
    features, values = make_inputs(lengths, feature_dim=3, value_dim=2, scale=0.5)
    masks = make_masks(lengths)
    random_features = torch.randn(5, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(0))
    inputs = [t.requires_grad_() for t in (*features, *values)]

    def function(*tensors):
        return F.multilinear_attention(
            list(tensors[:3]), list(tensors[3:]), masks, mode=mode, random_matrix=random_features
        )

    assert torch.autograd.gradcheck(function, inputs)


def test_gradcheck_random_features_and_pooling():
    x = torch.randn(2, 3, 4, dtype=DOUBLE, requires_grad=True)
    w = torch.randn(5, 4, dtype=DOUBLE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: F.positive_random_features(x, w), (x, w))
    inputs = [torch.randn(2, d, dtype=DOUBLE, requires_grad=True) for d in (3, 4, 2)]
    projections = [torch.randn(d, 5, dtype=DOUBLE, requires_grad=True) for d in (3, 4, 2)]
    pooling = torch.randn(5, 2, dtype=DOUBLE, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *t: F.multilinear_pooling(list(t[:3]), list(t[3:6]), t[6]), (*inputs, *projections, pooling)
    )


def test_multilinear_pooling_matches_a_hand_computation():
    generator = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(4, d, generator=generator, dtype=DOUBLE) for d in (3, 5, 2))
    u, v, w = (torch.randn(d, 6, generator=generator, dtype=DOUBLE) for d in (3, 5, 2))
    pooling = torch.randn(6, 2, generator=generator, dtype=DOUBLE)
    expected = torch.zeros(4, 2, dtype=DOUBLE)
    for b in range(4):
        for c in range(2):
            for i in range(6):  # MAN Eq. 3, element by element
                expected[b, c] += pooling[i, c] * (x[b] @ u[:, i]) * (y[b] @ v[:, i]) * (z[b] @ w[:, i])
    torch.testing.assert_close(F.multilinear_pooling([x, y, z], [u, v, w], pooling), expected)
    # m = 2 is low-rank bilinear pooling, BAN Eq. 2: P^T (U^T x o V^T y).
    bilinear = ((x @ u) * (y @ v)) @ pooling
    torch.testing.assert_close(F.multilinear_pooling([x, y], [u, v], pooling), bilinear)


@pytest.mark.parametrize(("length", "chunks"), [(8, 4), (10, 4), (3, 5), (17, 6)])
def test_lsc_inner_products_decrease_with_chunk_distance(length, chunks):
    scale = 0.7
    encoding = lsc_encoding = F.lsc_encoding(length, chunks, scale, dtype=DOUBLE)
    assert lsc_encoding.shape == (length, chunks)
    chunk = [t * chunks // length for t in range(length)]
    for t1 in range(length):
        assert encoding[t1, 0] == scale  # the first entry is always +e
        for t2 in range(length):
            expected = (chunks - 2 * abs(chunk[t1] - chunk[t2])) * scale**2  # note 3
            assert math.isclose(float(encoding[t1] @ encoding[t2]), expected, rel_tol=1e-12, abs_tol=1e-12)
    # The paper's example: the first two chunks are [e, -e, ..., -e] and [e, e, -e, ..., -e].
    first = F.lsc_encoding(chunks, chunks, 1.0)
    assert first[0].tolist() == [1.0] + [-1.0] * (chunks - 1)
    assert first[1].tolist() == [1.0, 1.0] + [-1.0] * (chunks - 2)


def test_lsc_from_mask_uses_each_samples_real_length():
    mask = torch.zeros(3, 9, dtype=torch.bool)
    mask[0] = True
    mask[1, :5] = True
    mask[2, [1, 3, 4, 8]] = True
    encoding = F.lsc_encoding_from_mask(mask, 4, 0.5, dtype=DOUBLE)
    torch.testing.assert_close(encoding[0], F.lsc_encoding(9, 4, 0.5, dtype=DOUBLE))
    torch.testing.assert_close(encoding[1, :5], F.lsc_encoding(5, 4, 0.5, dtype=DOUBLE))
    torch.testing.assert_close(encoding[2, [1, 3, 4, 8]], F.lsc_encoding(4, 4, 0.5, dtype=DOUBLE))
    assert torch.all(encoding[1, 5:] == 0) and torch.all(encoding[2, [0, 2, 5, 6, 7]] == 0)


@pytest.mark.parametrize(("num_features", "dim"), [(5, 8), (8, 8), (20, 8)])
def test_orthogonal_random_matrix_rows_are_orthogonal_within_blocks(num_features, dim):
    generator = torch.Generator().manual_seed(0)
    matrix = F.gaussian_random_matrix(num_features, dim, orthogonal=True, generator=generator, dtype=DOUBLE)
    assert matrix.shape == (num_features, dim)
    for start in range(0, num_features, dim):
        block = matrix[start : start + dim]
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 1e-10
    # Rows keep Gaussian norms: E|w|^2 = dim, checked over many draws.
    many = F.gaussian_random_matrix(4000, dim, orthogonal=True, generator=generator, dtype=DOUBLE)
    assert abs(many.pow(2).sum(1).mean().item() - dim) < 0.3
    again = F.gaussian_random_matrix(
        num_features, dim, orthogonal=True, generator=torch.Generator().manual_seed(0), dtype=DOUBLE
    )
    torch.testing.assert_close(again, matrix)  # seeded: reproducible


def test_pooling_had_and_lsc_errors_name_the_argument():
    x, y = torch.randn(2, 3, dtype=DOUBLE), torch.randn(2, 4, dtype=DOUBLE)
    u, v, pooling = torch.randn(3, 5, dtype=DOUBLE), torch.randn(4, 5, dtype=DOUBLE), torch.randn(5, 2, dtype=DOUBLE)
    with pytest.raises(ValueError, match="got 2 inputs but 1 projections"):
        F.multilinear_pooling([x, y], [u], pooling)
    with pytest.raises(ValueError, match=r"inputs\[1\] has feature size 4 but projections\[1\] has 3 rows"):
        F.multilinear_pooling([x, y], [u, u], pooling)
    with pytest.raises(ValueError, match=r"projections\[1\] has rank 4 but pooling has 5 rows"):
        F.multilinear_pooling([x, y], [u, v[:, :4]], pooling)
    features, values = make_inputs((3, 4))
    with pytest.raises(ValueError, match="random_matrix has rows of size 3, features have K' = 4"):
        F.multilinear_attention(features, values, mode="had", random_matrix=torch.randn(5, 3, dtype=DOUBLE))
    for temperature in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=rf'mode="had" needs temperature > 0, got {temperature}'):
            F.multilinear_attention(features, values, mode="had", random_matrix=torch.randn(5, 4, dtype=DOUBLE),
                                    temperature=temperature)
    for length, chunks in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match=f"length and chunks must be positive, got {length} and {chunks}"):
            F.lsc_encoding(length, chunks, 0.5)


def _message_case(name):
    """Inputs for one bad call of multilinear_attention: batch 7, lengths (3, 5, 2),
    K' = 4, K = 6 (all different, so a message that reads the wrong axis shows it)."""
    generator = torch.Generator().manual_seed(5)
    features = [torch.randn(7, t, 4, generator=generator, dtype=DOUBLE) for t in (3, 5, 2)]
    values = [torch.randn(7, t, 6, generator=generator, dtype=DOUBLE) for t in (3, 5, 2)]
    kwargs = {"mode": "exact"}
    if name == "features not a list":
        features = features[0]
    elif name == "values not a list":
        values = values[0]
    elif name == "one values too few":
        values = values[:2]
    elif name == "one values too many":
        features, values = features[:2], values
    elif name == "unknown mode":
        kwargs["mode"] = "fast"
    elif name == "features K'":
        features[1] = features[1][..., :3]
    elif name == "values K":
        values[1] = values[1][..., :2]
    elif name == "features batch":
        features[1] = features[1][:3]
    elif name == "values batch":
        values[1] = values[1][:3]
    elif name == "modality 0 batch":
        features[0], values[0] = features[0][:3], values[0][:3]
    elif name == "modality 0 features and values batch":
        features[0] = features[0][:3]
    elif name == "modalities 1 and 2 batch":  # each broadcasts with modality 0's (1,), not with each other
        features[0], values[0] = features[0][:1], values[0][:1]
        features[2], values[2] = features[2][:3], values[2][:3]
    elif name == "features dtype":
        features[1] = features[1].float()
    elif name == "values dtype":
        values[2] = values[2].float()
    elif name == "random matrix batch":
        kwargs.update(mode="had", random_matrix=torch.randn(3, 5, 4, dtype=DOUBLE))
    elif name == "no random matrix":
        kwargs["mode"] = "had"
    elif name == "random matrix K'":
        kwargs.update(mode="had", random_matrix=torch.randn(7, 5, 3, dtype=DOUBLE))
    return features, values, kwargs


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("features not a list", "features must be a list with one tensor per modality, got Tensor"),
        ("values not a list", "values must be a list with one tensor per modality, got Tensor"),
        ("one values too few", "values: expected exactly 3 modalities, got 2"),
        ("one values too many", "values: expected exactly 2 modalities, got 3"),
        ("unknown mode", "unknown mode 'fast'; expected one of exact, hadamard, had, auto"),
        ("features K'", "features[1] (modality 1) has shape (7, 5, 3); expected (B, T_1, K') with K' = 4 like modality 0"),
        ("values K", "values[1] (modality 1) has shape (7, 5, 2); expected (B, 5, K) with K = 6 like modality 0"),
        ("features batch", "modality 1: batch dims of features (3,) and values (7,) do not broadcast with each other and with (7,), those of the modalities before it"),
        ("values batch", "modality 1: batch dims of features (7,) and values (3,) do not broadcast with each other and with (7,), those of the modalities before it"),
        ("modality 0 batch", "modality 1: batch dims of features (7,) and values (7,) do not broadcast with each other and with (3,), those of the modalities before it"),
        ("modality 0 features and values batch", "modality 0: batch dims of features (3,) and values (7,) do not broadcast with each other and with (), those of the modalities before it"),
        ("modalities 1 and 2 batch", "modality 2: batch dims of features (3,) and values (3,) do not broadcast with each other and with (7,), those of the modalities before it"),
        ("features dtype", "modality 1: features have dtype torch.float32 and values torch.float64; expected torch.float64 for both, the dtype of modality 0's features"),
        ("values dtype", "modality 2: features have dtype torch.float64 and values torch.float32; expected torch.float64 for both, the dtype of modality 0's features"),
        ("random matrix batch", "random_matrix has batch dims (3,), which do not broadcast with the inputs' (7,)"),
        ("no random matrix", "mode=\"had\" needs random_matrix, the random matrix W of shape (H, K')"),
        ("random matrix K'", "random_matrix has rows of size 3, features have K' = 4"),
    ],
)
def test_attention_errors_name_what_and_where(name, message):
    """The whole message, so that a name, a size or a modality index read from the wrong
    place (or a dropped argument name) shows."""
    features, values, kwargs = _message_case(name)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        F.multilinear_attention(features, values, **kwargs)


@pytest.mark.parametrize("mode", ["exact", "hadamard", "had"])
def test_inputs_without_batch_dims_match_loops(mode):
    """Features (T_j, K') and values (T_j, K) with no leading dim at all are accepted and
    give the loops' result for the one sample (had: the brute-force tuple tensor)."""
    lengths = (3, 2, 4)
    features, values = make_inputs(lengths, batch=1)
    masks = make_masks(lengths, batch=1)
    matrix = F.gaussian_random_matrix(6, 4, orthogonal=False, generator=torch.Generator().manual_seed(2), dtype=DOUBLE)
    if mode == "had":
        expected = brute_force_had(features, values, masks, matrix, 0.6)[0][0]
    else:
        logit = cao_logit if mode == "exact" else hadamard_logit
        expected = loop_attention(features, values, masks, logit(features, 0.6))[0]
    actual = F.multilinear_attention([a[0] for a in features], [v[0] for v in values], [m[0] for m in masks],
                                     mode=mode, temperature=0.6, random_matrix=matrix, estimator="arf")
    assert actual.shape == (3,)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def test_multilinear_pooling_of_one_modality_and_of_leading_dims():
    """m = 1 is P^T (U^T v); inputs with two leading dims (2, 3, d_j): Eq. 3 element by
    element; the size check reads the last dim of 3-d inputs."""
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 3, 4, generator=generator, dtype=DOUBLE), torch.randn(2, 3, 2, generator=generator, dtype=DOUBLE)
    u, v = torch.randn(4, 5, generator=generator, dtype=DOUBLE), torch.randn(2, 5, generator=generator, dtype=DOUBLE)
    pooling = torch.randn(5, 3, generator=generator, dtype=DOUBLE)
    one = torch.zeros(2, 3, 3, dtype=DOUBLE)
    two = torch.zeros(2, 3, 3, dtype=DOUBLE)
    for b, s, c, i in itertools.product(range(2), range(3), range(3), range(5)):
        one[b, s, c] += pooling[i, c] * (x[b, s] @ u[:, i])
        two[b, s, c] += pooling[i, c] * (x[b, s] @ u[:, i]) * (y[b, s] @ v[:, i])
    torch.testing.assert_close(F.multilinear_pooling([x], [u], pooling), one, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(F.multilinear_pooling([x, y], [u, v], pooling), two, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"^inputs\[1\] has feature size 2 but projections\[1\] has 4 rows$"):
        F.multilinear_pooling([x, y], [u, u], pooling)
    with pytest.raises(ValueError, match=r"^inputs must be a list with one tensor per modality, got Tensor$"):
        F.multilinear_pooling(x, [u], pooling)
    with pytest.raises(ValueError, match=r"^inputs: expected at least 1 modalities, got 0$"):
        F.multilinear_pooling([], [], pooling)


def lsc_by_hand(length, chunks, scale):
    """MAN Eq. 8 (note 3): row t holds +scale at positions i <= floor(t C / length)."""
    return torch.tensor(
        [[scale if i <= t * chunks // length else -scale for i in range(chunks)] for t in range(length)],
        dtype=DOUBLE,
    )


def test_lsc_of_one_step_and_of_one_chunk():
    torch.testing.assert_close(F.lsc_encoding(1, 4, 0.5, dtype=DOUBLE), torch.tensor([[0.5, -0.5, -0.5, -0.5]], dtype=DOUBLE))
    torch.testing.assert_close(F.lsc_encoding(5, 1, 0.5, dtype=DOUBLE), torch.full((5, 1), 0.5, dtype=DOUBLE))


def test_lsc_from_a_mask_with_two_leading_dims_matches_the_hand_formula():
    """(2, 3, 9) masks: every row's real steps, numbered in order, get the vectors of a
    sequence of the row's real length; padded steps get zeros."""
    generator = torch.Generator().manual_seed(4)
    mask = torch.rand(2, 3, 9, generator=generator) > 0.5
    mask[..., 4] = True
    encoding = F.lsc_encoding_from_mask(mask, 3, 0.5, dtype=DOUBLE)
    assert encoding.shape == (2, 3, 9, 3)
    for i, j in itertools.product(range(2), range(3)):
        real = mask[i, j].nonzero().squeeze(-1)
        torch.testing.assert_close(encoding[i, j, real], lsc_by_hand(len(real), 3, 0.5), rtol=0, atol=0)
        assert torch.all(encoding[i, j, ~mask[i, j]] == 0)


def test_outputs_are_made_on_the_inputs_device():
    """Every tensor the functions create follows the inputs' device (here the meta
    device, which any machine has: a tensor made on the default device instead cannot
    be mixed with meta tensors)."""
    meta = torch.device("meta")
    assert F.lsc_encoding(6, 3, 0.5, device=meta).device == meta
    assert F.lsc_encoding(6, 3, 0.5, device="meta").device == meta
    assert F.lsc_encoding_from_mask(torch.ones(2, 6, dtype=torch.bool, device=meta), 3, 0.5, dtype=DOUBLE).device == meta
    features = [torch.empty(2, t, 4, device=meta) for t in (3, 5)]
    values = [torch.empty(2, t, 2, device=meta) for t in (3, 5)]
    masks = [torch.ones(2, t, dtype=torch.bool, device=meta) for t in (3, 5)]
    with validation("shapes"):  # values cannot be read on the meta device
        output = F.multilinear_attention(features, values, masks, mode="had",
                                         random_matrix=torch.empty(6, 4, device=meta))
    assert output.device == meta and output.shape == (2, 2)


def test_lsc_chunks_are_integer_divisions_even_for_long_sequences():
    """c(t) = floor(t C / length) computed on integers: for length 131327 and C = 256,
    step t = (255 length - 1) / 256 has t C / length = 255 - 1 / length, which float32
    rounds to 255, yet its chunk is 254 (the last entry is -scale)."""
    length, chunks = 131327, 256
    step = (255 * length - 1) // 256
    expected = torch.tensor([1.0] * 255 + [-1.0], dtype=torch.float16)
    assert F.lsc_encoding(length, chunks, 1.0, dtype=torch.float16)[step].equal(expected)
    mask = torch.ones(1, length, dtype=torch.bool)
    assert F.lsc_encoding_from_mask(mask, chunks, 1.0, dtype=torch.float16)[0, step].equal(expected)


def test_stacked_lsc_vectors_equal_each_modalitys_own_vectors():
    """lsc_encoding_stacked of three modalities stacked along time: each modality's span holds
    lsc_encoding of its own number of real steps at those steps (numbered within the
    modality), zeros at padded steps."""
    generator = torch.Generator().manual_seed(3)
    lengths = (5, 3, 7)
    mask = torch.rand(4, sum(lengths), generator=generator) > 0.4
    for start in (0, 5, 8):
        mask[:, start] = True
    encoding = F.lsc_encoding_stacked(mask, lengths, 3, 0.5, dtype=DOUBLE)
    start = 0
    for length in lengths:
        for b in range(4):
            real = torch.nonzero(mask[b, start : start + length]).flatten()
            expected = torch.zeros(length, 3, dtype=DOUBLE)
            expected[real] = F.lsc_encoding(len(real), 3, 0.5, dtype=DOUBLE)
            torch.testing.assert_close(encoding[b, start : start + length], expected, rtol=0, atol=0)
        start += length


def test_stacked_attention_equals_the_list_form_in_every_mode():
    """stacked_multilinear_attention on modalities concatenated along time gives what
    multilinear_attention gives on the list (exact mode against its own tensor path)."""
    generator = torch.Generator().manual_seed(8)
    lengths = (3, 4, 2)
    features = [torch.randn(2, t, 5, generator=generator, dtype=DOUBLE) * 0.3 for t in lengths]
    values = [torch.randn(2, t, 4, generator=generator, dtype=DOUBLE) for t in lengths]
    masks = [torch.rand(2, t, generator=generator) > 0.3 for t in lengths]
    for mask in masks:
        mask[:, 0] = True
    matrix = torch.randn(6, 5, generator=generator, dtype=DOUBLE)
    for mode in ("exact", "hadamard", "had"):
        options = {"mode": mode, "random_matrix": matrix, "temperature": 0.8, "return_attention": True}
        listed, listed_attention = F.multilinear_attention(features, values, masks, **options)
        stacked, stacked_attention = F.stacked_multilinear_attention(
            torch.cat(features, 1), torch.cat(values, 1), lengths, torch.cat(masks, 1), **options)
        torch.testing.assert_close(stacked, listed, rtol=1e-12, atol=1e-12)
        if mode == "had":
            for a, b in zip(stacked_attention, listed_attention, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        else:
            torch.testing.assert_close(stacked_attention, listed_attention, rtol=1e-12, atol=1e-12)


def test_stacked_attention_refuses_bad_input_naming_it():
    features, values = torch.randn(2, 5, 3), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"features has shape \(2, 5, 3\); expected \(B, T, d\) with T = 6"):
        F.stacked_multilinear_attention(features, values, (2, 4), mode="exact")
    with pytest.raises(ValueError, match="at least 2 modalities"):
        F.stacked_multilinear_attention(features, values, (5,), mode="exact")
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 2:] = False  # sample 1: modality 1 (steps 2..4) all padding
    with pytest.raises(ValueError, match=r"modality 1 is all padding for sample \(1,\)"):
        F.stacked_multilinear_attention(features, values, (2, 3), mask, mode="exact")
    with pytest.raises(ValueError, match="unknown mode 'other'"):
        F.stacked_multilinear_attention(features, values, (2, 3), mode="other")
    bad = features.clone()
    bad[0, 1, 0] = float("nan")
    with pytest.raises(ValueError, match="features contains NaN"):
        F.stacked_multilinear_attention(bad, values, (2, 3), mode="exact")
