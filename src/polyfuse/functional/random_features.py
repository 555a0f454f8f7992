"""Gaussian random matrices and positive random features (MAN Eq. 11, appendix G).

Shapes: ``H`` number of random features, ``K'`` feature size, ``T`` sequence length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "antithetic_rows",
    "gaussian_random_matrix",
    "gerf_alpha",
    "gerf_relative_variance",
    "positive_random_features",
]


def gaussian_random_matrix(
    num_features: int,
    dim: int,
    *,
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Draw the random matrix W whose rows w_h ~ N(0, I_dim) define the random features.

    Args:
        num_features: H, the number of rows.
        dim: K', the size of each row.
        orthogonal: draw orthogonal random features (MAN appendix G): rows are
            exactly orthogonal within each block of ``dim`` rows (blockwise when
            H > K'), and each row is rescaled by the norm of an independent
            Gaussian vector, so that every row is still marginally N(0, I) and
            the estimator of Eq. 11 stays unbiased.
        generator: the source of randomness; pass a seeded one for reproducibility.

    Returns:
        (H, K') tensor.
    """
    if num_features <= 0 or dim <= 0:
        raise ValueError(f"num_features and dim must be positive, got {num_features} and {dim}")
    kwargs = {"generator": generator, "dtype": dtype or torch.get_default_dtype(), "device": device}
    if not orthogonal:
        return torch.randn(num_features, dim, **kwargs)
    num_blocks = -(-num_features // dim)  # ceil(H / K') blocks of K' orthogonal rows
    gaussian = torch.randn(num_blocks, dim, dim, **kwargs)
    q, r = torch.linalg.qr(gaussian)
    # Sign fix makes Q Haar-distributed (QR alone is biased towards positive diagonals).
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    blocks = q.transpose(-1, -2)  # rows of each block are orthonormal
    rows = blocks.reshape(num_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, **kwargs).norm(dim=1, keepdim=True)
    return rows * norms


def positive_random_features(x: Tensor, random_features: Tensor, *, log: bool = False) -> Tensor:
    """Positive random features phi(x)_h = exp(w_h . x - |x|^2 / 2) (MAN Eq. 11).

    For w ~ N(0, I), E[prod_j phi(v_j)] = exp(sum_{j<k} v_j . v_k) (appendix E; note 1
    of the papers' README): the product over modalities of these features estimates
    the combinational additive attention kernel without the 1/H factor, which
    cancels between numerator and denominator (MAN Eq. 10 and 12).

    Args:
        x: (..., T, K') inputs.
        random_features: (..., H, K') matrix W (leading dims broadcast against x's).
        log: return the exponent w_h . x - |x|^2 / 2 instead of its exponential,
            for callers that stabilise before exponentiating (note 5).

    Returns:
        (..., T, H) features (or their logarithms).
    """
    if x.shape[-1] != random_features.shape[-1]:
        raise ValueError(
            f"x has feature size {x.shape[-1]} but random_features rows have size "
            f"{random_features.shape[-1]}"
        )
    exponent = torch.einsum("...tk,...hk->...th", x, random_features)
    exponent = exponent - 0.5 * x.pow(2).sum(-1, keepdim=True)
    return exponent if log else exponent.exp()


def antithetic_rows(random_features: Tensor) -> Tensor:
    """(..., H, K') -> (..., H, K'): the first ceil(H / 2) rows w_h, then -w_h for the
    first floor(H / 2) of them (antithetic pairs; same H, same marginal N(0, I) rows).

    The pair (w, -w) has the same weight exp(-alpha |w|^2) in the generalised features
    of :func:`gerf_alpha`; their estimates are negatively correlated whenever
    Q exp(-|u|^2) < 1 (:func:`gerf_relative_variance`), and the odd part of the noise,
    which differs between tuples, cancels within each pair.
    """
    num_features = random_features.shape[-2]
    kept = (num_features + 1) // 2
    return torch.cat([random_features[..., :kept, :], -random_features[..., : num_features - kept, :]], -2)


def gerf_alpha(spreads: Sequence[Tensor], dim: int) -> Tensor:
    """The parameter alpha >= 0 of the generalised exponential random features.

    For one tuple with centred sum u (``z`` minus the data's mean), the features
    ``exp(-alpha |w|^2 + sqrt(1 + 2 alpha) w . u)`` estimate
    (1 + 2 alpha)^(-K'/2) exp(|u|^2 / 2) with relative second moment
    R(u) = ((1 + 2 alpha)^2 / (1 + 4 alpha))^(K'/2) exp(|u|^2 / (1 + 4 alpha))
    (see :func:`gerf_relative_variance`). Averaged over tuples whose u is Gaussian
    N(0, sigma^2 I_K'), E_u R = ((1 + 2 alpha)^2 / (1 + 4 alpha - 2 sigma^2))^(K'/2),
    whose minimum over alpha is at alpha = sigma^2 (derivative
    4 / (1 + 2 alpha) - 4 / (1 + 4 alpha - 2 sigma^2) = 0), where it equals
    (1 + 2 sigma^2)^(K'/2); alpha = 0 (MAN's ARF) gives (1 - 2 sigma^2)^(-K'/2),
    infinite from sigma^2 = 1/2. docs/BENCHMARKS.md has the derivation.

    Args:
        spreads: per modality (...) mean_t |a_j[t] - c_j|^2; their sum is E_t |u_t|^2,
            the mean squared norm of the centred sums over all tuples (uniform weights).
        dim: K'.

    Returns:
        (...) alpha = sum of spreads / K' (= sigma^2).
    """
    total = spreads[0]
    for spread in spreads[1:]:
        total = total + spread
    return total.clamp_min(0) / dim


def gerf_relative_variance(
    squared_norm: float, alpha: float, dim: int, num_features: int, *, antithetic: bool = True
) -> float:
    """Var(K_hat) / K^2 of the H-feature estimate of one tuple's kernel (i.i.d. W rows).

    With X(w) = exp(-alpha |w|^2 + B w . u), B^2 = 1 + 2 alpha, w ~ N(0, I_d), Gaussian
    integrals give E X = (1 + 2 alpha)^(-d/2) exp(|u|^2 / 2) and
    E X^2 / (E X)^2 = R = Q exp(|u|^2 / (1 + 4 alpha)), Q = ((1 + 2 alpha)^2 / (1 + 4 alpha))^(d/2);
    for the antithetic partner E X(w) X(-w) / (E X)^2 = P = Q exp(-|u|^2). Averaging
    floor(H / 2) pairs and H mod 2 single rows gives
    Var / K^2 = (floor(H / 2) 2 (R - 1 + P - 1) + (H mod 2) (R - 1)) / H^2,
    i.e. (R + P - 2) / H for even H; without antithetic pairs (R - 1) / H. With alpha = 0
    and no pairs this is appendix Eq. 12 (note 4): (exp(|z|^2) - 1) / H.

    Args:
        squared_norm: |u|^2 (ARF: |z|^2, z = sum_j v_j).
        alpha: the parameter (0 for ARF).
        dim: d = K'.
        num_features: H.
        antithetic: whether the rows come in antithetic pairs (:func:`antithetic_rows`).
    """
    q = ((1 + 2 * alpha) ** 2 / (1 + 4 * alpha)) ** (dim / 2)
    r = q * math.exp(squared_norm / (1 + 4 * alpha))
    if not antithetic:
        return (r - 1) / num_features
    p = q * math.exp(-squared_norm)
    pairs, singles = divmod(num_features, 2)
    return (pairs * 2 * (r - 1 + p - 1) + singles * (r - 1)) / num_features**2
