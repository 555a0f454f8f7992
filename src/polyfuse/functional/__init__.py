"""Pure tensor math, no parameters: every function states its argument shapes and
cites the equation it implements."""

from polyfuse.functional.multilinear import (
    lsc_encoding,
    lsc_encoding_from_mask,
    multilinear_attention,
    multilinear_pooling,
)
from polyfuse.functional.random_features import gaussian_random_matrix, positive_random_features

__all__ = [
    "gaussian_random_matrix",
    "lsc_encoding",
    "lsc_encoding_from_mask",
    "multilinear_attention",
    "multilinear_pooling",
    "positive_random_features",
]
