"""Tests for polyfuse.nn.hoca: the HOCA / Low-Rank HOCA modules, MAF and the registry adapters.

The adapters get the registry contract checks here (output shape, finite values,
a gradient for every parameter, float32 and float64, padding invariance); the
modules are checked against computations written out from the paper's equations
with the modules' own parameters.
"""

from __future__ import annotations

import time

import pytest
import torch

import polyfuse
from polyfuse.functional.hoca import (
    bahdanau_attention,
    cp_weight_tensor,
    hoca_attention,
    low_rank_hoca_attention,
    query_conditioned_features,
)
from polyfuse.nn.hoca import HOCA, BahdanauAttention, LowRankHOCA, default_exact_max_length
from polyfuse.nn.maf import MAF, HOCAFusion, LowRankHOCAFusion, parse_orders

F64 = torch.float64
ADAPTERS = ["hoca", "lowrank_hoca"]
INPUT_DIMS = [6, 4, 5]
LENGTHS = [5, 7, 3]


def random_batch(seed, input_dims=INPUT_DIMS, lengths=LENGTHS, batch=4, dtype=torch.float32):
    """(B, T_j, d_j) inputs and trailing-padding masks; sample 0 full, the last one step."""
    gen = torch.Generator().manual_seed(seed)
    inputs, masks = [], []
    for dim, length in zip(input_dims, lengths, strict=True):
        inputs.append(torch.randn(batch, length, dim, generator=gen, dtype=dtype))
        real = torch.randint(1, length + 1, (batch,), generator=gen)
        real[0], real[-1] = length, 1
        masks.append(torch.arange(length)[None, :] < real[:, None])
    return inputs, masks


def masked_softmax(logits, mask):
    return logits.masked_fill(~mask, float("-inf")).softmax(-1)


# ---------------------------------------------------------------------------
# Registry contract, for the two adapters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ADAPTERS)
def test_registered_with_defaults_only(name):
    assert name in polyfuse.nn.available()
    module = polyfuse.nn.create(name, input_dims=INPUT_DIMS, out_dim=7)
    assert isinstance(module, HOCAFusion if name == "hoca" else LowRankHOCAFusion)
    assert isinstance(module, polyfuse.nn.FusionModule)
    inputs, masks = random_batch(0)
    out = module(inputs, masks)
    assert out.shape == (4, 7) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", ADAPTERS)
def test_shape_finite_and_gradient_for_every_parameter(name, dtype):
    torch.manual_seed(1)
    module = polyfuse.nn.create(name, input_dims=INPUT_DIMS, out_dim=7).to(dtype)
    inputs, masks = random_batch(1, dtype=dtype)
    out = module(inputs, masks)
    assert out.shape == (4, 7) and out.dtype == dtype and bool(torch.isfinite(out).all())
    out.square().sum().backward()
    for parameter_name, parameter in module.named_parameters():
        assert parameter.grad is not None, parameter_name
        assert bool(torch.isfinite(parameter.grad).all()), parameter_name
        assert float(parameter.grad.abs().sum()) > 0, parameter_name


@pytest.mark.parametrize("query", ["pooled", "learned"])
@pytest.mark.parametrize("name", ADAPTERS)
def test_padding_changes_nothing_and_matches_unpadded_samples(name, query):
    torch.manual_seed(2)
    module = polyfuse.nn.create(name, input_dims=INPUT_DIMS, out_dim=7, query=query).double()
    inputs, masks = random_batch(2, dtype=F64)
    reference = module(inputs, masks)
    poisoned = [
        x.masked_fill(~m.unsqueeze(-1), float("nan")) for x, m in zip(inputs, masks, strict=True)
    ]
    torch.testing.assert_close(module(poisoned, masks), reference, rtol=0, atol=0)
    # each sample alone, cut to its real steps, gives the same row
    for b in range(4):
        cut = [x[b : b + 1, : int(m[b].sum())] for x, m in zip(inputs, masks, strict=True)]
        torch.testing.assert_close(module(cut)[0], reference[b], rtol=0, atol=1e-12)
    # and the masks matter
    assert float((module(inputs) - reference).detach().abs().max()) > 1e-6


@pytest.mark.parametrize("name", ADAPTERS)
def test_two_dimensional_inputs_and_two_modalities(name):
    module = polyfuse.nn.create(name, input_dims=[3, 2], out_dim=4)
    out = module([torch.randn(2, 3), torch.randn(2, 6, 2)])
    assert out.shape == (2, 4) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("name", ADAPTERS)
def test_longer_input_than_max_lengths_is_refused(name):
    module = polyfuse.nn.create(name, input_dims=[3, 2], out_dim=4, max_lengths=[6, 4])
    assert module.maf.max_lengths == [6, 4]
    module([torch.randn(2, 6, 3), torch.randn(2, 4, 2)])  # at the limit: fine
    with pytest.raises(ValueError, match=r"modality 1 has 5 time steps.*max_lengths\[1\] = 4"):
        module([torch.randn(2, 6, 3), torch.randn(2, 5, 2)])


def test_adapter_options_and_errors():
    module = HOCAFusion([3, 2, 4], 5, orders="T", query="learned", attention_dim=8)
    assert module.maf.subsets == [(0, 1, 2)] and module.maf.max_lengths == [64, 64, 64]
    assert LowRankHOCAFusion([3, 2], 5, rank=3).maf.terms["0_1"].rank == 3
    assert LowRankHOCAFusion([3, 2], 5).maf.max_lengths == [512, 512]
    with pytest.raises(ValueError, match="query must be 'pooled' or 'learned'"):
        HOCAFusion([3, 2], 5, query="mean")
    with pytest.raises(ValueError, match="at least 2"):
        HOCAFusion([3], 5)


# ---------------------------------------------------------------------------
# Building blocks against the paper's equations
# ---------------------------------------------------------------------------


def test_bahdanau_module_is_eq_2_to_5():
    torch.manual_seed(3)
    module = BahdanauAttention(5, 3, attention_dim=6).double()
    query = torch.randn(2, 3, dtype=F64)
    (features,), (mask,) = random_batch(3, [5], [4], batch=2, dtype=F64)
    attention, context = module(query, features, mask)
    for b in range(2):
        logits = torch.stack(
            [
                module.score_vector
                @ torch.tanh(
                    module.query_projection.weight @ query[b]
                    + module.query_projection.bias
                    + module.feature_projection.weight @ features[b, r]
                )
                for r in range(4)
            ]
        )  # Eq. 3
        expected = masked_softmax(logits, mask[b])  # Eq. 2
        torch.testing.assert_close(attention[b], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(context[b], expected @ features[b], rtol=0, atol=1e-12)  # Eq. 5


def mapped_by_hand(module, query, inputs):
    """Eq. 3 with the module's own parameters."""
    return [
        query_conditioned_features(
            query, x, query_weight=qp.weight, feature_weight=fp.weight, bias=qp.bias
        )
        for x, qp, fp in zip(
            inputs,
            module.mapping.query_projections,
            module.mapping.feature_projections,
            strict=True,
        )
    ]


def test_hoca_module_uses_the_leading_slice_of_its_weights():
    torch.manual_seed(4)
    module = HOCA(INPUT_DIMS, 3, attention_dim=5, max_lengths=[6, 9, 4]).double()
    assert [tuple(w.shape) for w in module.weights] == [(9, 4), (6, 4), (6, 9)]
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(4, dtype=F64)
    output = module(query, inputs, masks)
    mapped = mapped_by_hand(module, query, inputs)
    for target, weight in enumerate(module.weights):
        lengths = [t for i, t in enumerate(LENGTHS) if i != target]
        expected = hoca_attention(mapped, target, weight[: lengths[0], : lengths[1]], masks)
        torch.testing.assert_close(output.attention[target], expected, rtol=0, atol=1e-12)
        context = torch.einsum("bt,btd->bd", expected, inputs[target])  # Eq. 5
        torch.testing.assert_close(output.context[target], context, rtol=0, atol=1e-12)


def test_low_rank_module_with_ones_equals_hoca_module_with_cp_weights():
    torch.manual_seed(5)
    low_rank = LowRankHOCA(INPUT_DIMS, 3, attention_dim=5, rank=2, max_lengths=[6, 9, 4]).double()
    exact = HOCA(INPUT_DIMS, 3, attention_dim=5, max_lengths=[6, 9, 4]).double()
    with torch.no_grad():
        exact.mapping.load_state_dict(low_rank.mapping.state_dict())
        for target, weight in enumerate(exact.weights):
            factors = [f for i, f in enumerate(low_rank.factors) if i != target]
            weight.copy_(cp_weight_tensor(list(factors)))  # Eq. 11
    assert all(bool((v == 1).all()) for v in low_rank.weight_vectors)  # starts at 1_d
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(5, dtype=F64)
    for a, b in zip(
        low_rank(query, inputs, masks).attention, exact(query, inputs, masks).attention, strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # with a learned w^{I_l} (Eq. 17) it is the functional op on the sliced factors
    with torch.no_grad():
        low_rank.weight_vectors[1].normal_()
    mapped = mapped_by_hand(low_rank, query, inputs)
    factors = [f[:, :t] for f, t in zip(low_rank.factors, LENGTHS, strict=True)]
    expected = low_rank_hoca_attention(mapped, 1, factors, low_rank.weight_vectors[1], masks)
    torch.testing.assert_close(
        low_rank(query, inputs, masks).attention[1], expected, rtol=0, atol=1e-12
    )


def test_exact_module_refuses_huge_weights_and_default_lengths():
    with pytest.raises(
        ValueError, match=r"weight tensor of modality 0 would have 100,000,000,000,000 entries"
    ):
        HOCA([2] * 8, 3, max_lengths=100)
    assert [default_exact_max_length(n) for n in range(2, 9)] == [64, 64, 64, 32, 16, 10, 7]
    assert HOCA([2] * 5, 3).max_lengths == [32] * 5


def test_low_rank_fusion_handles_eight_modalities_of_length_100():
    module = LowRankHOCAFusion([8] * 8, 4, orders="UT", attention_dim=16)
    inputs, masks = random_batch(6, [8] * 8, [100] * 8, batch=2)
    start = time.perf_counter()
    out = module(inputs, masks)
    out.sum().backward()
    assert time.perf_counter() - start < 10.0
    assert out.shape == (2, 4) and bool(torch.isfinite(out).all())


# ---------------------------------------------------------------------------
# MAF, Eq. 19 to 23
# ---------------------------------------------------------------------------


def test_parse_orders():
    assert parse_orders("UBT", 3) == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    assert parse_orders("ub", 3) == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]
    assert parse_orders(("unary", "ternary"), 3) == [(0,), (1,), (2,), (0, 1, 2)]
    assert parse_orders("T", 4) == [(0, 1, 2, 3)]  # ternary = all n modalities
    assert parse_orders([3], 4) == [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]
    assert parse_orders("BT", 2) == [(0, 1)]  # the same pair once
    assert parse_orders("binary", 2) == [(0, 1)]
    with pytest.raises(ValueError, match="unknown order 'x'"):
        parse_orders("UX", 3)
    with pytest.raises(ValueError, match="needs 4 modalities, there are 3"):
        parse_orders([4], 3)
    with pytest.raises(ValueError, match="at least one order"):
        parse_orders([], 3)


@pytest.mark.parametrize("low_rank", [False, True])
def test_maf_is_eq_19_to_23_of_its_terms(low_rank):
    torch.manual_seed(7)
    maf = MAF(INPUT_DIMS, 3, 4, orders="UBT", low_rank=low_rank, attention_dim=5, rank=2).double()
    with torch.no_grad():
        for theta in maf.order_weights:
            theta.normal_()
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(7, dtype=F64)
    details = maf(query, inputs, masks, return_details=True)
    torch.testing.assert_close(maf(query, inputs, masks), details.fused, rtol=0, atol=0)

    per_modality = [[] for _ in INPUT_DIMS]
    for subset, term in zip(maf.subsets, maf.terms.values(), strict=True):
        assert isinstance(
            term, BahdanauAttention if len(subset) == 1 else LowRankHOCA if low_rank else HOCA
        )
        if len(subset) == 1:
            i = subset[0]
            attentions = [
                bahdanau_attention(
                    query,
                    inputs[i],
                    masks[i],
                    query_weight=term.query_projection.weight,
                    feature_weight=term.feature_projection.weight,
                    score_vector=term.score_vector,
                    bias=term.query_projection.bias,
                )[0]
            ]
        else:
            attentions = term(
                query, [inputs[i] for i in subset], [masks[i] for i in subset]
            ).attention
        for i, attention in zip(subset, attentions, strict=True):
            per_modality[i].append(attention)
    assert [len(a) for a in per_modality] == [4, 4, 4]  # U, two B, T for each of 3 modalities

    contexts, scores, projected = [], [], []
    for i, (x, mask) in enumerate(zip(inputs, masks, strict=True)):
        theta = maf.order_weights[i]
        combined = sum(theta[k] * a for k, a in enumerate(per_modality[i]))  # Eq. 19
        attention = masked_softmax(combined, mask)
        torch.testing.assert_close(details.attention[i], attention, rtol=0, atol=1e-12)
        context = torch.einsum("bt,btd->bd", attention, x)  # Eq. 5
        contexts.append(context)
        hidden = torch.tanh(maf.fusion_query(query) + maf.fusion_contexts[i](context))
        scores.append(hidden @ maf.fusion_score)  # Eq. 21
        projected.append(maf.output_projections[i](context))  # Eq. 23
    beta = torch.stack(scores, 1).softmax(1)  # Eq. 20
    fused = sum(beta[:, i : i + 1] * projected[i] for i in range(3))  # Eq. 22
    torch.testing.assert_close(details.modality_weights, beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(details.fused, fused, rtol=0, atol=1e-12)
    for got, expected in zip(details.context, contexts, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_maf_orders_choose_the_terms():
    unary = MAF(INPUT_DIMS, 3, 4, orders="U")
    assert all(isinstance(t, BahdanauAttention) for t in unary.terms.values())
    assert [tuple(t.shape) for t in unary.order_weights] == [(1,), (1,), (1,)]
    query = torch.randn(4, 3)
    inputs, masks = random_batch(8)
    # no high-order term: any length is fine, since only HOCA weights are per step
    long_inputs = [torch.randn(1, 600, d) for d in INPUT_DIMS]
    assert unary(query[:1], long_inputs).shape == (1, 4)
    ub = MAF(INPUT_DIMS, 3, 4, orders="UB", low_rank=True)
    assert list(ub.terms) == ["0", "1", "2", "0_1", "0_2", "1_2"]
    assert ub(query, inputs, masks).shape == (4, 4)
    with pytest.raises(ValueError, match=r"query has shape \(4, 2\)"):
        ub(query[:, :2], inputs, masks)
