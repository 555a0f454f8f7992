"""had mode (``_had_attention``: the chunked path, the custom autograd function and the
whole-tensor path) against an oracle written here from the estimator's definition:
the exact CAO attention over every tuple of steps, reweighted by the tuple's random
factor, with each quantity (centring means, alpha, antithetic rows) computed from its
definition. Outputs, marginals and gradients, masks, leading dims, m = 2..6, forced
chunking, large inputs; and the kernel variance formula against Monte Carlo."""

import itertools
import math

import pytest
import torch

import polyfuse.functional as F
from polyfuse.functional import _had
from polyfuse.functional import multilinear as ML
from polyfuse.functional.random_features import gerf_relative_variance

DOUBLE = torch.float64


def make_case(lengths, lead=(3,), matrix_lead=(), feature_dim=5, value_dim=3, num_features=7,
              scale=0.5, seed=0, dtype=DOUBLE, padded=True):
    generator = torch.Generator().manual_seed(seed)
    features = [torch.randn(*lead, t, feature_dim, generator=generator, dtype=dtype) * scale
                for t in lengths]
    values = [torch.randn(*lead, t, value_dim, generator=generator, dtype=dtype) for t in lengths]
    masks = []
    for t in lengths:
        mask = torch.rand(*lead, t, generator=generator) > 0.35
        mask[..., 0] = True
        masks.append(mask if padded else torch.ones(*lead, t, dtype=torch.bool))
    # Padded steps zeroed, as multilinear_attention hands them over.
    features = [a.masked_fill(~m.unsqueeze(-1), 0) for a, m in zip(features, masks, strict=True)]
    values = [v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, masks, strict=True)]
    matrix = torch.randn(*matrix_lead, num_features, feature_dim, generator=generator, dtype=dtype)
    return features, values, masks, matrix


def oracle_one(features, values, masks, matrix, temperature, estimator):
    """One sample: features (T_j, K'), values (T_j, K), masks (T_j,), matrix (H, K').

    Every real tuple t gets the log-weight L_t + log sum_h r_h(t) with L_t the CAO
    logit (sum over pairs j < k of a~_j . a~_k, a~ = sqrt(temperature) a) and
    r_h(t) = exp(w_h . z_t - |z_t|^2 / 2), z_t = sum_j a~_j[t_j] (arf), or
    r_h(t) = exp(-alpha |w_h|^2 + sqrt(1 + 2 alpha) w_h . u_t - |u_t|^2 / 2) with
    u_t = sum_j (a~_j[t_j] - c_j), c_j the mean of a~_j over real steps,
    alpha = sum_j mean_t |a~_j[t] - c_j|^2 / K' and w_h the rows of W followed by the
    negated first floor(H / 2) rows (gerf). The attention is the softmax of the
    log-weights; output and marginals follow.
    """
    scaled = [a * math.sqrt(temperature) for a in features]
    dim = matrix.shape[-1]
    if estimator == "gerf":
        count = matrix.shape[0]
        kept = (count + 1) // 2
        rows = torch.cat([matrix[:kept], -matrix[: count - kept]])
        means = [a[m].mean(0) for a, m in zip(scaled, masks, strict=True)]
        alpha = sum((a[m] - c).pow(2).sum(-1).mean() for a, m, c in zip(scaled, masks, means, strict=True)) / dim
        factor = torch.sqrt(1 + 2 * alpha)
    else:
        rows, means, alpha, factor = matrix, [torch.zeros(dim, dtype=matrix.dtype)] * len(scaled), 0.0, 1.0
    real = [torch.nonzero(m).squeeze(-1).tolist() for m in masks]
    index_list = list(itertools.product(*real))
    log_weights = []
    for index in index_list:
        logit = sum(scaled[j][index[j]] @ scaled[k][index[k]]
                    for j, k in itertools.combinations(range(len(index)), 2))
        u = sum(scaled[j][t] - means[j] for j, t in enumerate(index))
        exponents = -alpha * (rows * rows).sum(-1) + factor * (rows @ u) - 0.5 * (u @ u)
        log_weights.append(logit + torch.logsumexp(exponents, 0))
    attention = torch.softmax(torch.stack(log_weights), 0)
    output = torch.zeros(values[0].shape[-1], dtype=values[0].dtype)
    marginals = [torch.zeros(len(m), dtype=values[0].dtype) for m in masks]
    for weight, index in zip(attention, index_list, strict=True):
        product = torch.ones_like(output)
        for j, t in enumerate(index):
            product = product * values[j][t]
            marginals[j] = marginals[j].index_add(0, torch.tensor([t]), weight.reshape(1))
        output = output + weight * product
    return output, marginals


def oracle(features, values, masks, matrix, temperature=0.7, estimator="gerf"):
    """:func:`oracle_one` over the broadcast leading dims of the inputs."""
    lead = torch.broadcast_shapes(*(a.shape[:-2] for a in features), matrix.shape[:-2])
    features = [a.expand(*lead, *a.shape[-2:]) for a in features]
    values = [v.expand(*lead, *v.shape[-2:]) for v in values]
    masks = [m.expand(*lead, m.shape[-1]) for m in masks]
    matrix = matrix.expand(*lead, *matrix.shape[-2:])
    outputs, marginals = [], [[] for _ in features]
    for position in itertools.product(*(range(n) for n in lead)):
        output, marginal = oracle_one([a[position] for a in features], [v[position] for v in values],
                                      [m[position] for m in masks], matrix[position], temperature, estimator)
        outputs.append(output)
        for j, mg in enumerate(marginal):
            marginals[j].append(mg)
    return (torch.stack(outputs).reshape(*lead, -1),
            [torch.stack(mg).reshape(*lead, -1) for mg in marginals])


def fast(features, values, masks, matrix, temperature=0.7, *, grad=False, estimator="gerf", attention=True):
    """``_had_attention`` on what ``multilinear_attention`` hands it: padded steps filled
    with zeros in the graph (the fill is where their gradient is zeroed)."""
    with torch.set_grad_enabled(grad):
        features = [a if m is None else a.masked_fill(~m.unsqueeze(-1), 0) for a, m in zip(features, masks, strict=True)]
        values = [v if m is None else v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, masks, strict=True)]
        result = ML._had_attention(features, values, masks, matrix, temperature, attention, estimator)
    return result if attention else (result, None)


def assert_same(actual, expected, rtol=1e-10, atol=1e-10):
    """Output and, unless none were asked for (None), every marginal."""
    output, marginals = actual
    expected_output, expected_marginals = expected
    torch.testing.assert_close(output.detach(), expected_output, rtol=rtol, atol=atol)
    if marginals is None:
        return
    assert len(marginals) == len(expected_marginals)
    for marginal, expected_marginal in zip(marginals, expected_marginals, strict=True):
        torch.testing.assert_close(marginal.detach(), expected_marginal, rtol=rtol, atol=atol)


@pytest.mark.parametrize("m", range(2, 7))
@pytest.mark.parametrize("equal_lengths", [True, False])
@pytest.mark.parametrize("path", ["chunked", "function", "whole"])
@pytest.mark.parametrize("estimator", ["gerf", "arf"])
def test_had_equals_the_tuple_oracle_for_two_to_six_modalities(m, equal_lengths, path, estimator):
    lengths = [3] * m if equal_lengths else [2 + (j % 3) for j in range(m)]
    features, values, masks, matrix = make_case(lengths, lead=(2,), seed=m)
    expected = oracle(features, values, masks, matrix, estimator=estimator)
    grad = path != "chunked"
    inputs = [t.clone().requires_grad_(grad) for t in features]
    actual = fast(inputs, values, masks, matrix, grad=grad, estimator=estimator, attention=path != "function")
    assert_same(actual, expected)


@pytest.mark.parametrize(
    ("lead", "matrix_lead"),
    [((2,), ()), ((2, 3), (3,)), ((2, 3), ()), ((2, 3, 2), (3, 1)), ((1, 3), (2, 1)), ((2, 1, 2), (2, 3, 1))],
)
@pytest.mark.parametrize("padded", [False, True])
def test_had_equals_the_oracle_for_leading_dims_and_masks(lead, matrix_lead, padded):
    features, values, masks, matrix = make_case((3, 4, 2), lead=lead, matrix_lead=matrix_lead, padded=padded)
    expected = oracle(features, values, masks, matrix)
    assert_same(fast(features, values, masks, matrix), expected)
    if not padded:  # None: a modality without padding
        assert_same(fast(features, values, [None] * 3, matrix), expected)


def test_had_with_a_modality_without_mask_and_values_shared_by_the_batch():
    """Masks for some modalities only (None: no padding) and values without the batch dim:
    the oracle's result on the inputs expanded to the batch, the missing mask all True."""
    features, values, masks, matrix = make_case((3, 4, 2), lead=(2,))
    masks[1] = torch.ones(2, 4, dtype=torch.bool)
    given_values = [v[0] for v in values]
    values = [v[:1].expand(2, -1, -1) for v in values]
    values = [v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, masks, strict=True)]
    expected = oracle(features, values, masks, matrix)
    given_masks = [masks[0], None, masks[2]]
    actual = F.multilinear_attention(features, given_values, given_masks, mode="had", random_matrix=matrix,
                                     temperature=0.7, return_attention=True)
    assert_same(actual, expected)
    # no mask at all: values shared by the batch keep their batch dim from the features
    expected = oracle(features, [v.expand(2, -1, -1) for v in given_values], [torch.ones_like(m) for m in masks],
                      matrix)
    actual = F.multilinear_attention(features, given_values, None, mode="had", random_matrix=matrix,
                                     temperature=0.7, return_attention=True)
    assert_same(actual, expected)


@pytest.mark.parametrize("shared", ["values", "features"])
def test_had_broadcasts_features_and_values_against_each_other(shared):
    """Values shared by the batch (no leading dim) against batched features, and
    features of batch 1 against values of batch 2: the result is the oracle's on the
    inputs expanded to the common batch."""
    features, values, masks, matrix = make_case((3, 4, 2), lead=(2,))
    if shared == "values":
        given_features, given_values, given_masks = features, [v[0] for v in values], masks
        values = [v[:1].expand(2, -1, -1) for v in values]
        values = [v if m is None else v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, masks, strict=True)]
    else:
        given_features, given_values = [a[:1] for a in features], values
        given_masks = [m[:1] for m in masks]
        features = [a[:1].expand(2, -1, -1) for a in features]
        masks = [m[:1].expand(2, -1) for m in masks]
        values = [v if m is None else v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, masks, strict=True)]
    expected = oracle(features, values, masks, matrix)
    actual = F.multilinear_attention(given_features, given_values, given_masks, mode="had", random_matrix=matrix,
                                     temperature=0.7, return_attention=True)
    assert_same(actual, expected)


def test_a_float32_random_matrix_is_used_in_the_features_dtype():
    """W stored in float32 (as a module may keep it) with float64 inputs: the work runs
    in float64 on W's values, so the result is the float64 oracle's."""
    features, values, masks, matrix = make_case((3, 4, 2), lead=(2,))
    matrix32 = matrix.float()
    expected = oracle(features, values, masks, matrix32.double())
    actual = F.multilinear_attention(features, values, masks, mode="had", random_matrix=matrix32,
                                     temperature=0.7, return_attention=True)
    assert actual[0].dtype == DOUBLE
    assert_same(actual, expected)
    # and so when W is learnt (its columns are then rebuilt every call, not kept)
    learnt = F.multilinear_attention(features, values, masks, mode="had", random_matrix=matrix32.requires_grad_(),
                                     temperature=0.7, return_attention=True)
    assert_same(learnt, expected)


def test_a_random_matrix_made_in_inference_mode_works():
    """Inference tensors have no version counter: their columns are rebuilt every call."""
    features, values, masks, matrix = make_case((3, 4, 2), lead=(2,))
    expected = oracle(features, values, masks, matrix)
    with torch.inference_mode():
        inference_matrix = matrix.clone()
        actual = F.multilinear_attention(features, values, masks, mode="had", random_matrix=inference_matrix,
                                         temperature=0.7, return_attention=True)
    assert_same(actual, expected)


@pytest.mark.parametrize("budget", [1, 600, 3500])
@pytest.mark.parametrize("lengths", [(3, 3, 3), (2, 5, 3)])
def test_chunked_forward_and_backward_equal_the_oracle_whatever_the_chunk_size(monkeypatch, budget, lengths):
    """Tiny budgets split the work by heads and rows (remainder chunks included)."""
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", budget)
    features, values, masks, matrix = make_case(lengths, lead=(5, 3), matrix_lead=(3,))
    assert_same(fast(features, values, masks, matrix), oracle(features, values, masks, matrix))
    weights = torch.randn(5, 3, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(2))
    chunked = gradients(lambda *t: fast(*t, grad=True, attention=False)[0], features, values, masks, matrix,
                        weights)
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", 4 << 20)
    expected = gradients(lambda *t: oracle(*t)[0], features, values, masks, matrix, weights)
    for actual, wanted in zip(chunked, expected, strict=True):
        torch.testing.assert_close(actual, wanted, rtol=1e-9, atol=1e-10)


def gradients(function, features, values, masks, matrix, weights):
    inputs = [t.clone().requires_grad_() for t in (*features, *values, matrix)]
    m = len(features)
    output = function(inputs[:m], inputs[m : 2 * m], masks, inputs[-1])
    return torch.autograd.grad((output * weights).sum(), inputs)


@pytest.mark.parametrize("estimator", ["gerf", "arf"])
@pytest.mark.parametrize("attention", [False, True])
def test_gradients_equal_the_oracle_gradients(estimator, attention):
    """The custom backward (no marginals) and the autograd path (marginals) against
    autograd through the oracle."""
    features, values, masks, matrix = make_case((4, 3, 2), lead=(2, 2), matrix_lead=(2,))
    weights = torch.randn(2, 2, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(9))

    def function(*tensors):
        return fast(*tensors, grad=True, estimator=estimator, attention=attention)[0]

    expected = gradients(lambda *t: oracle(*t, estimator=estimator)[0], features, values, masks, matrix, weights)
    for actual, wanted in zip(gradients(function, features, values, masks, matrix, weights), expected,
                              strict=True):
        torch.testing.assert_close(actual, wanted, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("lengths", [(2, 3), (2, 3, 2), (2, 2, 2, 2)])
def test_gradcheck_of_the_custom_backward(lengths):
    features, values, masks, matrix = make_case(lengths, lead=(2, 2), matrix_lead=(2,), num_features=4,
                                                feature_dim=3, value_dim=2)
    inputs = [t.clone().requires_grad_() for t in (*features, *values, matrix)]
    m = len(lengths)

    def function(*tensors):
        return ML._had_attention(list(tensors[:m]), list(tensors[m : 2 * m]), masks, tensors[-1], 0.8, False)

    assert torch.autograd.gradcheck(function, inputs)


def test_double_backward_is_a_clear_error_not_a_wrong_zero():
    features, values, masks, matrix = make_case((2, 3), lead=(2,), num_features=3, feature_dim=2, value_dim=2)
    inputs = [t.clone().requires_grad_() for t in features]
    output = ML._had_attention(inputs, values, masks, matrix, 1.0, False)
    with pytest.raises(RuntimeError, match=r'^multilinear_attention\(mode="had"\): the backward is not differentiable '
                                           r'\(no second derivatives\); use mode="exact" for double backward$'):
        torch.autograd.grad(output.sum(), inputs[0], create_graph=True)


@pytest.mark.parametrize("scale", [9.0, 40.0])
def test_large_inputs_match_the_oracle_in_float64_and_stay_accurate_in_float32(scale):
    """The stabilisation (note 5) is exact: float64 to 1e-9 of the log-domain oracle;
    float32 finite and within 1e-3 (relative to the largest output)."""
    features, values, masks, matrix = make_case((3, 4, 5), lead=(2,), scale=scale, seed=5)
    expected = oracle(features, values, masks, matrix)
    assert_same(fast(features, values, masks, matrix), expected, rtol=1e-9, atol=1e-9)
    # The paths with gradients stabilise too: the custom function, the whole-tensor path.
    inputs = [a.clone().requires_grad_() for a in features]
    for attention in (False, True):
        assert_same(fast(inputs, values, masks, matrix, grad=True, attention=attention), expected,
                    rtol=1e-9, atol=1e-9)
    single = ([a.float() for a in features], [v.float() for v in values], masks, matrix.float())
    output32, _ = fast(*single)
    assert torch.isfinite(output32).all()
    torch.testing.assert_close(output32.double(), expected[0], rtol=1e-3,
                               atol=1e-3 * expected[0].abs().max().item())


def test_the_man_shapes_large_enough_for_several_chunks(monkeypatch):
    """The layout MAN hands over: features (B, G, T, K' + C), values (B, G, T, K) as a
    strided view, masks (B, 1, T), random features (G, H, K' + C)."""
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", 20_000)
    generator = torch.Generator().manual_seed(1)
    batch, heads, length, value_dim, chunks = 3, 2, 5, 4, 2
    features, values = [], []
    for _ in range(3):
        projected = torch.randn(batch, length, heads * value_dim, generator=generator, dtype=DOUBLE)
        values.append(projected.view(batch, length, heads, value_dim).transpose(1, 2))  # strided
        a = torch.randn(batch, heads, length, value_dim, generator=generator, dtype=DOUBLE) * 0.3
        lsc = F.lsc_encoding(length, chunks, 0.5, dtype=DOUBLE).expand(batch, heads, length, chunks)
        features.append(torch.cat([a, lsc], -1))
    masks = [torch.ones(batch, 1, length, dtype=torch.bool)] * 3
    masks[1] = masks[1].clone()
    masks[1][2, 0, 3:] = False
    matrix = torch.randn(heads, 16, value_dim + chunks, generator=generator, dtype=DOUBLE)
    full_masks = [m.expand(batch, heads, length) for m in masks]
    zeroed_values = [v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, full_masks, strict=True)]
    zeroed_features = [a.masked_fill(~m.unsqueeze(-1), 0) for a, m in zip(features, full_masks, strict=True)]
    expected = oracle(zeroed_features, zeroed_values, full_masks, matrix, 0.35)
    with torch.no_grad():
        output, marginals = F.multilinear_attention(
            features, values, masks, mode="had", random_matrix=matrix, temperature=0.35,
            return_attention=True,
        )
    assert_same((output, marginals), expected)


def test_padded_content_never_reaches_the_output_or_the_gradients():
    features, values, masks, matrix = make_case((3, 5, 4), lead=(2, 3), matrix_lead=(3,))
    noisy_features = [a.masked_fill(~m.unsqueeze(-1), float("nan")) for a, m in zip(features, masks, strict=True)]
    noisy_values = [v.masked_fill(~m.unsqueeze(-1), float("inf")) for v, m in zip(values, masks, strict=True)]
    expected = oracle(features, values, masks, matrix, 1.0)[0]
    for grad in (False, True):  # the chunked path, then the custom backward
        with torch.set_grad_enabled(grad):
            inputs = [t.clone().requires_grad_(grad) for t in noisy_features]
            noisy = F.multilinear_attention(inputs, noisy_values, masks, mode="had", random_matrix=matrix)
        torch.testing.assert_close(noisy.detach(), expected, rtol=1e-10, atol=1e-10)
        if grad:
            noisy.sum().backward()
            for gradient, mask in zip((t.grad for t in inputs), masks, strict=True):
                assert torch.isfinite(gradient).all()
                assert (gradient[~mask] == 0).all()


@pytest.mark.parametrize("num_features", [16, 17, 64])
def test_gerf_kernel_variance_matches_the_formula(num_features):
    """Var(K_hat) / K^2 = (floor(H/2) 2 (R - 1 + P - 1) + (H mod 2)(R - 1)) / H^2
    (:func:`gerf_relative_variance`) for i.i.d. Gaussian W, measured over 20000 draws
    on one tuple of m = 3 two-step modalities, through the library's own feature rows
    (``augmented_features``) and weights (``augmented_weights``)."""
    generator = torch.Generator().manual_seed(0)
    dim = 6
    features = [torch.randn(1, 2, dim, generator=generator, dtype=DOUBLE) * 0.3 for _ in range(3)]
    stacked = torch.cat(features, -2).unsqueeze(0)  # (G, N, T, K') = (1, 1, 6, K')
    rows, scale = _had.augmented_features(stacked, None, 1.0, "gerf", (2, 2, 2))  # (1, 1, 6, K' + 2)
    first = rows[0, 0, ::2]  # the tuple (0, 0, 0): step 0 of each two-step modality, (3, K' + 2)
    draws = 20000
    matrices = torch.randn(draws, num_features, dim, generator=generator, dtype=DOUBLE)
    weights = _had.augmented_weights(matrices, "gerf", DOUBLE)  # (draws, K' + 2, H)
    exponent = scale[0, 0] * (first.sum(0) @ weights)  # sigma x W
    estimates = torch.exp(exponent).mean(-1)  # (1/H) sum_h prod_j B_j[0, h]
    # The formula's inputs from their definitions: u = sum_j (a_j[0] - c_j), alpha = E|u|^2 / K'.
    centred = [a[0] - a[0].mean(0) for a in features]
    u = sum(c[0] for c in centred)
    alpha = sum(float(c.pow(2).sum(-1).mean()) for c in centred) / dim
    predicted = gerf_relative_variance(float(u @ u), alpha, dim, num_features)
    mean = float(estimates.mean())
    measured = float(estimates.var()) / mean**2
    # E K_hat = (1 + 2 alpha)^(-K'/2) exp(L - const): the mean matches that up to 2%.
    assert abs(measured - predicted) <= 0.15 * predicted
    expected_mean = (1 + 2 * alpha) ** (-dim / 2) * float(torch.exp(scale[0, 0] * first.sum(0)[dim] + 0.5 * (u @ u)))
    assert abs(mean - expected_mean) <= 0.02 * expected_mean


def test_arf_kernel_variance_formula_reduces_to_appendix_eq_12():
    for z2, h in ((0.7, 16), (1.5, 64)):
        assert gerf_relative_variance(z2, 0.0, 8, h, antithetic=False) == pytest.approx(math.expm1(z2) / h)


@pytest.mark.parametrize("features", [8, 24, 32, 40, 512])
@pytest.mark.parametrize("dtype", [torch.float32, DOUBLE])
def test_max_over_steps_equals_amax(features, dtype):
    exponent = torch.randn(3, 2, 7, features, dtype=dtype)
    exponent[0, 1, 3] = float("-inf")  # a padded step
    torch.testing.assert_close(_had.max_over_steps(exponent), exponent.amax(dim=-2), rtol=0, atol=0)
    assert _had.max_over_steps(exponent[:, :, ::2]).equal(exponent[:, :, ::2].amax(dim=-2))
    # Five dims (the per-modality view of had_whole): the steps are still axis -2, not 2.
    by_modality = torch.randn(2, 3, 4, 5, features, dtype=dtype)
    assert _had.max_over_steps(by_modality).equal(by_modality.amax(dim=-2))
    assert _had.max_over_steps(by_modality[:, :, :, ::2]).equal(by_modality[:, :, :, ::2].amax(dim=-2))


def test_broadcast_shape_agrees_with_torch():
    for shapes in [((2, 3), (3,)), ((1, 4), (5, 1), ()), ((2, 0), (1,)), ((3, 1, 2), (4, 1))]:
        assert ML._broadcast_shape(*shapes) == torch.broadcast_shapes(*shapes)
    with pytest.raises(RuntimeError, match=r"^shapes \[\(2, 3\), \(4,\)\] do not broadcast$"):
        ML._broadcast_shape((2, 3), (4,))


def test_finite_check_reports_nan_inf_but_not_an_overflowing_sum():
    big = torch.full((2, 3, 4), 3e38)  # finite, but their sum overflows to Inf
    values = torch.ones(2, 3, 2)
    out = F.multilinear_attention([big * 1e-38, big * 1e-38], [values, values], mode="exact")
    torch.testing.assert_close(out, torch.ones(2, 2))  # products of ones, whatever the weights
    F.multilinear_attention([big, big * 0], [values, values], mode="hadamard")  # no error raised
    bad = big.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"features\[0\] \(modality 0\) contains NaN at index \(1, 2, 3\)"):
        F.multilinear_attention([bad, big], [values, values], mode="exact")


def test_unknown_estimator_is_a_clear_error():
    features, values, masks, matrix = make_case((3, 4), lead=(2,))
    with pytest.raises(ValueError, match="unknown estimator 'favor'; expected one of gerf, arf"):
        F.multilinear_attention(features, values, masks, mode="had", random_matrix=matrix, estimator="favor")


@pytest.mark.parametrize(
    ("heads", "rows", "budget", "expected"),
    [
        (2, 10, 6_400 // 2, (2, 10)),  # everything is exactly twice the budget: one chunk
        (2, 10, 6_400 // 2 - 1, (2, 4)),  # just over: all heads, as many rows as fit
        (2, 10, 1_000, (2, 1)),  # one row of all heads fits (640 bytes), two do not
        (2, 10, 640, (2, 1)),  # exactly one row of all heads
        (4, 10, 700, (2, 1)),  # not even one row of all heads: as many heads as fit
        (4, 10, 300, (1, 1)),  # not even one head of one row: one at a time
    ],
)
def test_chunk_sizes_take_as_much_as_fits_the_budget(monkeypatch, heads, rows, budget, expected):
    """One head and one row of lengths (4, 6) and H = 8 in float32 is a block of 10 x 8 x 4 =
    320 bytes: everything when it is at most twice the budget, else all heads and
    budget // (heads x block) rows, else budget // block heads (at least one)."""
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", budget)
    layout = _had.HadLayout(torch.Size([rows, heads]), (1, 0), heads, rows, (4, 6), (0, 4, 10))
    assert _had.chunk_sizes(layout, 8, torch.empty(0)) == expected


def test_gradients_without_any_mask_equal_the_oracle_gradients():
    """No modality padded (no masks at all): the custom backward without a padding tensor."""
    features, values, masks, matrix = make_case((3, 2, 4), lead=(2,), padded=False)
    weights = torch.randn(2, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(4))

    def function(f, v, _masks, w):
        return ML._had_attention(f, v, [None] * len(f), w, 0.7, False)

    actual = gradients(function, features, values, masks, matrix, weights)
    expected = gradients(lambda *t: oracle(*t)[0], features, values, masks, matrix, weights)
    for got, wanted in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-10)


def test_float32_gradients_of_large_inputs_stay_finite_and_accurate():
    """Exponents of several hundred: the backward recomputes the random features with the
    same stabilisers as the forward, so float32 gradients match float64 ones."""
    features, values, masks, matrix = make_case((3, 4, 5), lead=(2,), scale=9.0, seed=5)
    weights = torch.randn(2, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(6))

    def function(f, v, m, w):
        return fast(f, v, m, w, grad=True, attention=False)[0]

    expected = gradients(function, features, values, masks, matrix, weights)
    single = gradients(function, [a.float() for a in features], [v.float() for v in values], masks,
                       matrix.float(), weights.float())
    for got, wanted in zip(single, expected, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), wanted, rtol=1e-2, atol=1e-2 * wanted.abs().max().item())


def test_segment_sums_and_their_gradient_equal_loops_over_the_steps():
    """Sums per modality along any axis, against a loop; the gradient of each step is the
    gradient of its modality's sum (gradcheck in float64)."""
    generator = torch.Generator().manual_seed(4)
    lengths = (2, 4, 3)
    ids = _had.segments(lengths, DOUBLE, torch.device("cpu")).ids
    assert ids.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2]
    x = torch.randn(2, 9, 5, generator=generator, dtype=DOUBLE, requires_grad=True)
    sums = _had.segment_sums(x, ids, 3, -2)
    expected = torch.stack([x[:, 0:2].sum(1), x[:, 2:6].sum(1), x[:, 6:9].sum(1)], 1)
    torch.testing.assert_close(sums, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(_had.segment_sums(x.transpose(1, 2), ids, 3, -1), expected.transpose(1, 2))
    assert torch.autograd.gradcheck(lambda t: _had.segment_sums(t, ids, 3, 1), (x,))


def test_dot_by_segment_and_its_gradients_equal_the_gathered_dot_product():
    generator = torch.Generator().manual_seed(5)
    lengths = (3, 1, 2)
    ids = _had.segments(lengths, DOUBLE, torch.device("cpu")).ids
    x = torch.randn(2, 6, 4, generator=generator, dtype=DOUBLE, requires_grad=True)
    vectors = torch.randn(2, 3, 4, generator=generator, dtype=DOUBLE, requires_grad=True)
    result = _had.dot_by_segment(x, vectors, ids)
    by_hand = torch.stack([(x[:, t] * vectors[:, ids[t]]).sum(-1) for t in range(6)], -1)
    torch.testing.assert_close(result, by_hand, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, v: _had.dot_by_segment(a, v, ids), (x, vectors))
    # each input alone needing its gradient
    (only_x,) = torch.autograd.grad(_had.dot_by_segment(x, vectors.detach(), ids).sum(), x)
    torch.testing.assert_close(only_x, vectors.detach().index_select(1, ids), rtol=0, atol=0)
    (only_vectors,) = torch.autograd.grad(_had.dot_by_segment(x.detach(), vectors, ids).sum(), vectors)
    expected = torch.stack([x.detach()[:, 0:3].sum(1), x.detach()[:, 3:4].sum(1), x.detach()[:, 4:6].sum(1)], 1)
    torch.testing.assert_close(only_vectors, expected, rtol=0, atol=1e-14)


def test_segments_are_built_once_per_lengths_dtype_and_device():
    first = _had.segments((3, 2), DOUBLE, torch.device("cpu"))
    assert _had.segments((3, 2), DOUBLE, torch.device("cpu")) is first
    assert _had.segments((2, 3), DOUBLE, torch.device("cpu")).ids.tolist() == [0, 0, 1, 1, 1]
    assert first.counts.tolist() == [3.0, 2.0] and first.counts.dtype == DOUBLE
    assert first.minus_first.tolist() == [-1.0, -1.0, -1.0, 0.0, 0.0]


def test_weight_columns_are_rebuilt_when_the_random_matrix_changes_in_place():
    matrix = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(6))
    first = _had.augmented_weights_of(matrix, "gerf", torch.float32)
    assert _had.augmented_weights_of(matrix, "gerf", torch.float32) is first  # kept
    torch.testing.assert_close(first, _had.augmented_weights(matrix, "gerf", torch.float32), rtol=0, atol=0)
    assert not _had.augmented_weights_of(matrix, "arf", torch.float32).equal(first)  # per estimator
    matrix.mul_(2.0)  # a redraw or a load changes the buffer in place
    torch.testing.assert_close(_had.augmented_weights_of(matrix, "gerf", torch.float32),
                               _had.augmented_weights(matrix, "gerf", torch.float32), rtol=0, atol=0)
    trained = matrix.clone().requires_grad_()
    assert _had.augmented_weights_of(trained, "gerf", torch.float32).requires_grad  # never kept
