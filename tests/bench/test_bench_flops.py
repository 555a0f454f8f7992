"""FLOP counts: the counter against hand counts, for had mode (both of its paths) and
for the paper's four variants."""

import pytest
import torch

import polyfuse.functional as F
from polyfuse.bench.measure import count_flops
from polyfuse.bench.paper import (
    VARIANTS,
    attention_flops_by_hand,
    build_variant,
    integration_layer_flops,
)
from polyfuse.bench.targets import had_flops_by_hand


@pytest.mark.parametrize("grad", [False, True])
def test_had_flops_match_a_hand_count(grad):
    """B = 2 samples, G = 3 heads, lengths (4, 5, 6), K' = 5, K = 2, H = 7.

    By hand, per sample and head: the exponent of the random features, 2 T_j (K' + 2) H
    (the +2 are the columns carried in the product: the per-step log-weight and the
    -alpha |w|^2 term of the gerf estimator), and the contraction of Eq. 10, 2 T_j H K:
    2 * 15 * 7 * 7 + 2 * 15 * 7 * 2 = 1470 + 420 = 1890; times 6 = 11340.
    """
    lengths, heads, feature_dim, value_dim, num_features = (4, 5, 6), 3, 5, 2, 7
    features = [torch.randn(2, heads, t, feature_dim, requires_grad=grad) for t in lengths]
    values = [torch.randn(2, heads, t, value_dim) for t in lengths]
    matrix = torch.randn(heads, num_features, feature_dim)

    def run():
        with torch.set_grad_enabled(grad):
            return F.multilinear_attention(features, values, mode="had", random_matrix=matrix)

    assert count_flops(run) == 11340
    method = had_flops_by_hand(batch=2, heads=heads, lengths=list(lengths), feature_dim=feature_dim,
                               value_dim=value_dim, num_random_features=num_features)
    assert method == 2 * 3 * (2 * 15 * 7 * (5 + 2))  # without the norm column
    assert count_flops(run) - method == 2 * 3 * 2 * 2 * 15 * 7


@pytest.mark.parametrize("name", list(VARIANTS))
def test_paper_variants_attention_flops_match_the_hand_count(name):
    module = build_variant(name)
    length = 6
    flops = integration_layer_flops(module, length)
    hand = attention_flops_by_hand(mode=VARIANTS[name]["mode"], length=length, chunks=VARIANTS[name]["chunks"])
    heads, modalities = 10, 3
    if VARIANTS[name]["mode"] == "had":  # the counter also sees the two extra columns
        hand += heads * modalities * 2 * length * 24 * 2
    assert flops["attention"] == hand
    assert flops["projections"] == 2 * modalities * length * 2 * 40 * 40  # U' and U'', 40 -> 40
    assert flops["total"] == flops["attention"] + flops["projections"]
