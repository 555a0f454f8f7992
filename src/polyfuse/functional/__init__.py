"""Pure tensor math, no parameters: every function states its argument shapes and
cites the equation it implements."""

from polyfuse.functional.bilinear import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_attention_pooling,
    bilinear_logits_of_features,
    bilinear_pooling_of_features,
    bilinear_residual_glimpses,
)
from polyfuse.functional.chimera_losses import (
    chimera_objective,
    distortion_loss,
    hyperbolic_matching_loss,
    topic_lm_loss,
    topic_matching_loss,
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
from polyfuse.functional.lorentz import (
    clip_radius,
    einstein_midpoint,
    klein_to_lorentz,
    lorentz_attention,
    lorentz_distance,
    lorentz_expmap0,
    lorentz_factor,
    lorentz_inner,
    lorentz_logmap0,
    lorentz_pairwise_distance,
    lorentz_project,
    lorentz_to_klein,
)
from polyfuse.functional.multilinear import (
    lsc_encoding,
    lsc_encoding_from_mask,
    lsc_encoding_stacked,
    multilinear_attention,
    multilinear_pooling,
    stacked_multilinear_attention,
)
from polyfuse.functional.pooling import masked_mean
from polyfuse.functional.random_features import gaussian_random_matrix, positive_random_features
from polyfuse.functional.tensor_fusion import append_one, low_rank_fusion, tensor_fusion

__all__ = [
    "append_one",
    "bahdanau_attention",
    "bilinear_attention_logits",
    "bilinear_attention_map",
    "bilinear_attention_pooling",
    "bilinear_logits_of_features",
    "bilinear_pooling_of_features",
    "bilinear_residual_glimpses",
    "chimera_objective",
    "clip_radius",
    "cp_weight_tensor",
    "distortion_loss",
    "einstein_midpoint",
    "gaussian_random_matrix",
    "high_order_correlation",
    "hoca_attention",
    "hoca_attention_all_targets",
    "hyperbolic_matching_loss",
    "klein_to_lorentz",
    "lorentz_attention",
    "lorentz_distance",
    "lorentz_expmap0",
    "lorentz_factor",
    "lorentz_inner",
    "lorentz_logmap0",
    "lorentz_pairwise_distance",
    "lorentz_project",
    "lorentz_to_klein",
    "low_rank_fusion",
    "low_rank_hoca_attention",
    "low_rank_hoca_attention_all_targets",
    "lsc_encoding",
    "lsc_encoding_from_mask",
    "lsc_encoding_stacked",
    "masked_mean",
    "multilinear_attention",
    "multilinear_pooling",
    "positive_random_features",
    "query_conditioned_features",
    "stacked_multilinear_attention",
    "tensor_fusion",
    "topic_lm_loss",
    "topic_matching_loss",
]
