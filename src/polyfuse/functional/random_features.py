"""Gaussian random matrices and positive random features (MAN Eq. 11, appendix G).

Shapes: ``H`` number of random features, ``K'`` feature size, ``T`` sequence length.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gaussian_random_matrix", "positive_random_features"]


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
