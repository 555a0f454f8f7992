"""The fast had path (``_had_attention``) against the straightforward one
(``_had_attention_reference``, MAN Eq. 10 to 12 as they read): same outputs,
marginals and gradients, with masks, large inputs, leading dims, m = 2..8, both of
its paths (chunked, without gradients; whole tensors, with) and forced chunking."""

import itertools

import pytest
import torch

import polyfuse.functional as F
from polyfuse.functional import _had
from polyfuse.functional import multilinear as ML

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


def fast(features, values, masks, matrix, temperature=0.7, *, grad=False):
    if grad:
        return ML._had_attention(features, values, masks, matrix, temperature, True)
    with torch.no_grad():
        return ML._had_attention(features, values, masks, matrix, temperature, True)


def reference(features, values, masks, matrix, temperature=0.7):
    return ML._had_attention_reference(features, values, masks, matrix, temperature, True)


def assert_same(actual, expected, rtol=1e-10, atol=1e-10):
    output, marginals = actual
    expected_output, expected_marginals = expected
    torch.testing.assert_close(output.detach(), expected_output, rtol=rtol, atol=atol)
    assert len(marginals) == len(expected_marginals)
    for marginal, expected_marginal in zip(marginals, expected_marginals, strict=True):
        torch.testing.assert_close(marginal.detach(), expected_marginal, rtol=rtol, atol=atol)


@pytest.mark.parametrize("m", range(2, 9))
@pytest.mark.parametrize("equal_lengths", [True, False])
@pytest.mark.parametrize("grad", [False, True])
def test_fast_equals_reference_for_two_to_eight_modalities(m, equal_lengths, grad):
    lengths = [3] * m if equal_lengths else [2 + (j % 3) for j in range(m)]
    features, values, masks, matrix = make_case(lengths, seed=m)
    if grad:
        matrix.requires_grad_()
    assert_same(fast(features, values, masks, matrix, grad=grad),
                reference(features, values, masks, matrix.detach()))


@pytest.mark.parametrize(
    ("lead", "matrix_lead"),
    [((2,), ()), ((2, 3), (3,)), ((2, 3), ()), ((4, 3, 2), (3, 1)), ((4, 3, 2), (2,)), ((1, 3), (2, 1))],
)
@pytest.mark.parametrize("padded", [False, True])
def test_fast_equals_reference_for_leading_dims_and_masks(lead, matrix_lead, padded):
    features, values, masks, matrix = make_case((3, 4, 2), lead=lead, matrix_lead=matrix_lead, padded=padded)
    expected = reference(features, values, masks, matrix)
    assert_same(fast(features, values, masks, matrix), expected)
    no_masks = None if padded else [None] * 3  # None: a modality without padding
    if no_masks is not None:
        assert_same(fast(features, values, no_masks, matrix), expected)


@pytest.mark.parametrize("budget", [1, 600, 3000, 3500])
@pytest.mark.parametrize("lengths", [(3, 3, 3), (2, 5, 3)])
def test_chunked_path_equals_reference_whatever_the_chunk_size(monkeypatch, budget, lengths):
    """Tiny budgets split the work by heads and rows (remainder chunks included); 3500
    bytes gives chunks of all 3 heads and 2 of the 5 rows, whose padding masks are not
    contiguous."""
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", budget)
    features, values, masks, matrix = make_case(lengths, lead=(5, 3), matrix_lead=(3,))
    assert_same(fast(features, values, masks, matrix), reference(features, values, masks, matrix))


@pytest.mark.parametrize("scale", [9.0, 40.0])
def test_large_inputs_match_in_float64_and_float32_is_as_accurate_as_the_reference(scale):
    """The stabilisation (note 5) is the reference's: exact in float64 to 1e-10, and in
    float32 no less accurate than the reference against the float64 result."""
    features, values, masks, matrix = make_case((3, 4, 5), lead=(4,), scale=scale, seed=5)
    expected = reference(features, values, masks, matrix)
    assert torch.isfinite(expected[0]).all()
    assert_same(fast(features, values, masks, matrix), expected)
    single = ([a.float() for a in features], [v.float() for v in values], masks, matrix.float())
    output32, _ = fast(*single)
    reference32, _ = reference(*single)
    assert torch.isfinite(output32).all()
    error_fast = (output32.double() - expected[0]).abs().max()
    error_reference = (reference32.double() - expected[0]).abs().max()
    assert error_fast <= 2 * error_reference + 1e-5 * expected[0].abs().max()


@pytest.mark.parametrize("grad", [False, True])
def test_float32_matches_reference_to_relative_1e_5(grad):
    features, values, masks, matrix = make_case((6, 7, 5), lead=(4, 2), matrix_lead=(2,),
                                                num_features=32, feature_dim=8, dtype=torch.float32)
    if grad:
        matrix.requires_grad_()
    output, marginals = fast(features, values, masks, matrix, grad=grad)
    expected, expected_marginals = reference(features, values, masks, matrix.detach())
    assert output.dtype == torch.float32
    torch.testing.assert_close(output.detach(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    for marginal, expected_marginal in zip(marginals, expected_marginals, strict=True):
        torch.testing.assert_close(marginal.detach(), expected_marginal, rtol=1e-5, atol=1e-6)


def test_the_man_shapes_large_enough_for_several_chunks(monkeypatch):
    """The layout MAN hands over: features (B, G, T, K' + C), values (B, G, T, K) as a
    strided view, masks (B, 1, T), random features (G, H, K' + C)."""
    monkeypatch.setitem(_had.CHUNK_BYTES, "cpu", 20_000)
    generator = torch.Generator().manual_seed(1)
    batch, heads, length, value_dim, chunks = 6, 4, 9, 8, 3
    features, values = [], []
    for _ in range(3):
        projected = torch.randn(batch, length, heads * value_dim, generator=generator, dtype=DOUBLE)
        values.append(projected.view(batch, length, heads, value_dim).transpose(1, 2))  # strided
        a = torch.randn(batch, heads, length, value_dim, generator=generator, dtype=DOUBLE) * 0.3
        lsc = F.lsc_encoding(length, chunks, 0.5, dtype=DOUBLE).expand(batch, heads, length, chunks)
        features.append(torch.cat([a, lsc], -1))
    masks = [torch.ones(batch, 1, length, dtype=torch.bool)] * 3
    masks[1] = masks[1].clone()
    masks[1][2, 0, 5:] = False
    matrix = torch.randn(heads, 16, value_dim + chunks, generator=generator, dtype=DOUBLE)
    full_masks = [m.expand(batch, heads, length) for m in masks]
    zeroed_values = [v.masked_fill(~m.unsqueeze(-1), 0) for v, m in zip(values, full_masks, strict=True)]
    zeroed_features = [a.masked_fill(~m.unsqueeze(-1), 0) for a, m in zip(features, full_masks, strict=True)]
    expected = reference(zeroed_features, zeroed_values, full_masks, matrix, 0.35)
    with torch.no_grad():
        output, marginals = F.multilinear_attention(
            features, values, masks, mode="had", random_features=matrix, temperature=0.35,
            return_attention=True,
        )
    assert_same((output, marginals), expected)


@pytest.mark.parametrize("lengths", [(2, 3), (2, 3, 2), (2, 2, 2, 2)])
def test_gradcheck_of_the_fast_path(lengths):
    features, values, masks, matrix = make_case(lengths, lead=(2, 2), matrix_lead=(2,), num_features=4,
                                                feature_dim=3, value_dim=2)
    inputs = [t.clone().requires_grad_() for t in (*features, *values, matrix)]
    m = len(lengths)

    def function(*tensors):
        output, marginals = ML._had_attention(
            list(tensors[:m]), list(tensors[m : 2 * m]), masks, tensors[-1], 0.8, True
        )
        return output, *marginals

    assert torch.autograd.gradcheck(function, inputs)


def test_gradgradcheck_of_the_fast_path():
    features, values, masks, matrix = make_case((2, 3), lead=(2,), num_features=3, feature_dim=2,
                                                value_dim=2)
    inputs = [t.clone().requires_grad_() for t in (*features, *values)]

    def function(*tensors):
        return ML._had_attention(list(tensors[:2]), list(tensors[2:]), masks, matrix, 1.0, False)

    assert torch.autograd.gradgradcheck(function, inputs)


def test_gradients_equal_the_reference_gradients():
    features, values, masks, matrix = make_case((4, 3, 5), lead=(3, 2), matrix_lead=(2,))
    weights = torch.randn(3, 2, 3, dtype=DOUBLE, generator=torch.Generator().manual_seed(9))

    def gradients(function):
        inputs = [t.clone().requires_grad_() for t in (*features, *values, matrix)]
        output, marginals = function(inputs[:3], inputs[3:6], masks, inputs[6], 0.6, True)
        loss = (output * weights).sum() + sum((mg**2).sum() for mg in marginals)
        return torch.autograd.grad(loss, inputs)

    for actual, expected in zip(gradients(ML._had_attention), gradients(ML._had_attention_reference),
                                strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def test_padded_content_never_reaches_the_fast_path_output():
    features, values, masks, matrix = make_case((3, 5, 4), lead=(2, 3), matrix_lead=(3,))
    noisy_features = [a.masked_fill(~m.unsqueeze(-1), float("nan")) for a, m in zip(features, masks, strict=True)]
    noisy_values = [v.masked_fill(~m.unsqueeze(-1), float("inf")) for v, m in zip(values, masks, strict=True)]
    for grad in (False, True):  # the chunked path, then the autograd one
        with torch.set_grad_enabled(grad):
            clean = F.multilinear_attention(
                [t.clone().requires_grad_(grad) for t in features], values, masks, mode="had",
                random_features=matrix,
            )
            inputs = [t.clone().requires_grad_(grad) for t in noisy_features]
            noisy = F.multilinear_attention(inputs, noisy_values, masks, mode="had", random_features=matrix)
        torch.testing.assert_close(noisy.detach(), clean.detach(), rtol=0, atol=0)
        if grad:
            noisy.sum().backward()
            for gradient, mask in zip((t.grad for t in inputs), masks, strict=True):
                assert torch.isfinite(gradient).all()
                assert (gradient[~mask] == 0).all()


@pytest.mark.parametrize("features", [8, 24, 32, 40, 512])
@pytest.mark.parametrize("dtype", [torch.float32, DOUBLE])
def test_max_over_steps_equals_amax(features, dtype):
    exponent = torch.randn(3, 2, 7, features, dtype=dtype)
    exponent[0, 1, 3] = float("-inf")  # a padded step
    torch.testing.assert_close(_had.max_over_steps(exponent), exponent.amax(dim=-2), rtol=0, atol=0)
    assert _had.max_over_steps(exponent[:, :, ::2]).equal(exponent[:, :, ::2].amax(dim=-2))


def test_broadcast_shape_agrees_with_torch():
    for shapes in [((2, 3), (3,)), ((1, 4), (5, 1), ()), ((2, 0), (1,)), ((3, 1, 2), (4, 1))]:
        assert ML._broadcast_shape(*shapes) == torch.broadcast_shapes(*shapes)
    with pytest.raises(RuntimeError):
        ML._broadcast_shape((2, 3), (4,))


def test_finite_check_reports_nan_inf_but_not_an_overflowing_sum():
    big = torch.full((2, 3, 4), 3e38)  # finite, but their sum overflows to Inf
    values = torch.ones(2, 3, 2)
    out = F.multilinear_attention([big * 1e-38, big * 1e-38], [values, values], mode="exact")
    assert torch.isfinite(out).all()
    F.multilinear_attention([big, big * 0], [values, values], mode="hadamard")  # no error raised
    bad = big.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"features\[0\] \(modality 0\) contains NaN at index \(1, 2, 3\)"):
        F.multilinear_attention([bad, big], [values, values], mode="exact")


def test_every_combination_of_modes_and_masks_runs_the_same_validation():
    features, values, masks, matrix = make_case((3, 4), lead=(2,))
    for mode, given in itertools.product(ML.MODES, (None, masks)):
        out = F.multilinear_attention(features, values, given, mode=mode, random_features=matrix)
        assert out.shape == (2, 3) and torch.isfinite(out).all()
