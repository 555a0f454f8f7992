"""Pure tensor math, no parameters: every function states its argument shapes and
cites the equation it implements."""

from polyfuse.functional.bilinear import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_attention_pooling,
)
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
from polyfuse.functional.multilinear import (
    lsc_encoding,
    lsc_encoding_from_mask,
    multilinear_attention,
    multilinear_pooling,
)
from polyfuse.functional.random_features import gaussian_random_matrix, positive_random_features

__all__ = [
    "bahdanau_attention",
    "bilinear_attention_logits",
    "bilinear_attention_map",
    "bilinear_attention_pooling",
    "cp_weight_tensor",
    "gaussian_random_matrix",
    "high_order_correlation",
    "hoca_attention",
    "hoca_attention_all_targets",
    "low_rank_hoca_attention",
    "low_rank_hoca_attention_all_targets",
    "lsc_encoding",
    "lsc_encoding_from_mask",
    "multilinear_attention",
    "multilinear_pooling",
    "positive_random_features",
    "query_conditioned_features",
]
