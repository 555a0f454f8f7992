"""Random matrices and random features (``polyfuse.functional.random_features``) against
oracles written here: the generator's own draws orthonormalised by Gram-Schmidt (MAN
appendix G), loops over Eq. 11, the antithetic rows by hand, and the kernel variance
from Gauss-Hermite quadrature of the Gaussian integrals (no Monte Carlo)."""

import math

import numpy as np
import pytest
import torch

import polyfuse.functional as F
from polyfuse.functional.random_features import antithetic_rows, gerf_alpha, gerf_relative_variance

DOUBLE = torch.float64


def test_iid_matrix_is_the_generators_gaussian_draw():
    matrix = F.gaussian_random_matrix(5, 3, orthogonal=False, generator=torch.Generator().manual_seed(4),
                                      dtype=DOUBLE)
    expected = torch.randn(5, 3, generator=torch.Generator().manual_seed(4), dtype=DOUBLE)
    assert matrix.equal(expected)
    default = F.gaussian_random_matrix(5, 3, orthogonal=False, generator=torch.Generator().manual_seed(4))
    assert default.dtype == torch.get_default_dtype()


def gram_schmidt_columns(matrix):
    """Q of the QR factorisation with a positive diagonal of R (unique): classical
    Gram-Schmidt on the columns."""
    columns = []
    for i in range(matrix.shape[1]):
        column = matrix[:, i].clone()
        for previous in columns:
            column = column - (previous @ matrix[:, i]) * previous
        columns.append(column / column.norm())
    return torch.stack(columns, dim=1)


@pytest.mark.parametrize(("num_features", "dim"), [(3, 3), (5, 3), (7, 3), (2, 4), (1, 3), (3, 1)])
def test_orthogonal_matrix_is_gram_schmidt_of_the_generators_draws(num_features, dim):
    """Appendix G: blocks of dim orthonormal rows (the Haar-distributed Q, i.e. the QR
    factor whose R has a positive diagonal), each row scaled by the norm of an
    independent Gaussian vector; the draws in this order from the generator."""
    matrix = F.gaussian_random_matrix(num_features, dim, generator=torch.Generator().manual_seed(1),
                                      dtype=DOUBLE)
    generator = torch.Generator().manual_seed(1)
    blocks = -(-num_features // dim)
    gaussian = torch.randn(blocks, dim, dim, generator=generator, dtype=DOUBLE)
    norms = torch.randn(num_features, dim, generator=generator, dtype=DOUBLE).norm(dim=1)
    rows = torch.cat([gram_schmidt_columns(block).T for block in gaussian])[:num_features]
    expected = torch.stack([rows[h] * norms[h] for h in range(num_features)])
    torch.testing.assert_close(matrix, expected, rtol=1e-10, atol=1e-12)


def test_matrix_sizes_must_be_positive():
    for sizes in ((0, 3), (3, 0)):
        with pytest.raises(ValueError, match=rf"num_features and dim must be positive, got {sizes[0]} and {sizes[1]}"):
            F.gaussian_random_matrix(*sizes)


def test_positive_random_features_match_eq_11_by_loops():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, generator=generator, dtype=DOUBLE)  # (B, T, K')
    w = torch.randn(5, 4, generator=generator, dtype=DOUBLE)  # (H, K')
    exponent = torch.zeros(2, 3, 5, dtype=DOUBLE)
    for b in range(2):
        for t in range(3):
            for h in range(5):
                exponent[b, t, h] = sum(w[h, k] * x[b, t, k] for k in range(4)) - 0.5 * sum(
                    x[b, t, k] ** 2 for k in range(4)
                )
    torch.testing.assert_close(F.positive_random_features(x, w), exponent.exp(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(F.positive_random_features(x, w, log=True), exponent, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="x has feature size 4 but random_features rows have size 3"):
        F.positive_random_features(x, w[:, :3])
    # One matrix per sample, (B, H, K'): the rows' size is still the last dim.
    per_sample = torch.stack([w, w.flip(0)])
    expected = torch.stack([exponent[0], exponent[1].flip(-1)])
    torch.testing.assert_close(F.positive_random_features(x, per_sample, log=True), expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="x has feature size 4 but random_features rows have size 3"):
        F.positive_random_features(x, per_sample[..., :3])  # (B, H, 3): the size is the last dim, not H


def test_antithetic_rows_by_hand():
    w = torch.arange(1.0, 16.0).reshape(5, 3)
    odd = antithetic_rows(w)
    assert odd.equal(torch.stack([w[0], w[1], w[2], -w[0], -w[1]]))
    even = antithetic_rows(w[:4])
    assert even.equal(torch.stack([w[0], w[1], -w[0], -w[1]]))
    stacked = antithetic_rows(torch.stack([w[:4], 2 * w[:4]]))  # leading dims: one matrix each
    assert stacked[1].equal(2 * even)


def test_gerf_alpha_is_the_mean_squared_norm_per_dimension():
    spreads = [torch.tensor([1.5, 0.2]), torch.tensor([0.5, 0.6]), torch.tensor([2.0, 0.0])]
    torch.testing.assert_close(gerf_alpha(spreads, 4), torch.tensor([1.0, 0.2]))
    assert gerf_alpha([torch.tensor(-1e-9), torch.tensor(0.0)], 3).item() == 0  # rounding: never < 0


def gaussian_expectation(function, dim):
    """E f(w) for w ~ N(0, I_dim) when f is a product over coordinates: the product of
    1-d Gauss-Hermite quadratures (probabilists' weight exp(-x^2 / 2), 80 nodes)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / math.sqrt(2 * math.pi)
    return math.prod(float(np.sum(weights * function(nodes, i))) for i in range(dim))


@pytest.mark.parametrize("alpha", [0.0, 0.35])
@pytest.mark.parametrize("num_features", [4, 5])
def test_gerf_relative_variance_matches_quadrature(alpha, num_features):
    """X(w) = exp(-alpha |w|^2 + B w . u), B^2 = 1 + 2 alpha. The estimate averages X over
    H rows: with antithetic pairs floor(H / 2) pairs (w, -w) and H mod 2 single rows,
    Var = (H Var X + 2 floor(H / 2) Cov(X(w), X(-w))) / H^2; without, Var X / H."""
    u = np.array([0.3, -0.5, 0.4])
    dim, factor = len(u), math.sqrt(1 + 2 * alpha)

    def power(sign_second):
        return lambda w, i: np.exp(-alpha * w**2 + factor * w * u[i]) * np.exp(
            -alpha * w**2 + sign_second * factor * w * u[i]
        )

    mean = gaussian_expectation(lambda w, i: np.exp(-alpha * w**2 + factor * w * u[i]), dim)
    second = gaussian_expectation(power(1), dim)
    antithetic = gaussian_expectation(power(-1), dim)
    variance, covariance = second - mean**2, antithetic - mean**2
    pairs = num_features // 2
    expected = (num_features * variance + 2 * pairs * covariance) / num_features**2 / mean**2
    squared_norm = float(u @ u)
    assert gerf_relative_variance(squared_norm, alpha, dim, num_features) == pytest.approx(expected, rel=1e-9)
    independent = variance / num_features / mean**2
    assert gerf_relative_variance(squared_norm, alpha, dim, num_features, antithetic=False) == pytest.approx(
        independent, rel=1e-9
    )
