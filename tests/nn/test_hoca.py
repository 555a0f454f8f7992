"""Tests for polyfuse.nn.hoca: the HOCA / Low-Rank HOCA modules, MAF and the registry adapters.

The adapters get the registry contract checks here (output shape, finite values,
a gradient for every parameter, float32 and float64, padding invariance); the
modules are checked against computations written out from the paper's equations
with the modules' own parameters.
"""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

import polyfuse
from polyfuse.functional.hoca import cp_weight_tensor
from polyfuse.nn.hoca import HOCA, BahdanauAttention, LowRankHOCA, default_exact_max_length
from polyfuse.nn.maf import MAF, HOCAFusion, LowRankHOCAFusion, combine_attentions, parse_orders

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
# Brute-force references, written from the paper's equations with explicit loops
# over samples, time steps and index tuples; they read the modules' parameters
# but none of polyfuse's functions.
# ---------------------------------------------------------------------------


def loop_softmax(logits, mask_row):
    """Softmax over the real steps of a list of scalar logits; 0 at padded steps."""
    real = [float(v) for v, m in zip(logits, mask_row, strict=True) if m]
    top = max(real)
    exps = [math.exp(float(v) - top) if m else 0.0 for v, m in zip(logits, mask_row, strict=True)]
    total = sum(exps)
    return torch.tensor([e / total for e in exps], dtype=F64)


def loop_mapped(query_projection, feature_projection, query_b, x_b):
    """HOCA Eq. 3 inside: tanh(W h + b + U x_r) for every step r of one sample."""
    return [
        torch.tanh(
            query_projection.weight.double() @ query_b
            + query_projection.bias.double()
            + feature_projection.weight.double() @ x_b[r]
        )
        for r in range(x_b.shape[0])
    ]


@torch.no_grad()
def loop_bahdanau(term, query, x, mask):
    """HOCA Eq. 2-3 for a BahdanauAttention module: (B, T) attention."""
    rows = []
    for b in range(x.shape[0]):
        mapped = loop_mapped(term.query_projection, term.feature_projection, query[b], x[b])
        scores = [float(term.score_vector.double() @ v) for v in mapped]  # Eq. 3
        rows.append(loop_softmax(scores, mask[b].tolist()))  # Eq. 2
    return torch.stack(rows)


def _mapped_all(term, query, xs, b):
    return [
        loop_mapped(qp, fp, query[b], x[b])
        for qp, fp, x in zip(
            term.mapping.query_projections, term.mapping.feature_projections, xs, strict=True
        )
    ]


@torch.no_grad()
def loop_hoca(term, query, xs, masks):
    """HOCA Eq. 7-9 for a HOCA module: sum over every real index tuple of W * C."""
    n = len(xs)
    out = [[] for _ in range(n)]
    for b in range(xs[0].shape[0]):
        mapped = _mapped_all(term, query, xs, b)
        for target in range(n):
            others = [i for i in range(n) if i != target]
            weight = term.weights[target].double()
            scores = []
            for r in range(xs[target].shape[1]):
                total = 0.0
                for rest in itertools.product(*[range(xs[i].shape[1]) for i in others]):
                    if not all(bool(masks[i][b, s]) for i, s in zip(others, rest, strict=True)):
                        continue  # a padded step: C is zero there (Eq. 7 on zeroed features)
                    product = mapped[target][r].clone()
                    for i, s in zip(others, rest, strict=True):
                        product = product * mapped[i][s]  # Hadamard products of Eq. 7
                    total += float(weight[rest]) * float(product.sum())  # 1_d, then W, Eq. 9
                scores.append(total)
            out[target].append(loop_softmax(scores, masks[target][b].tolist()))  # Eq. 9
    return [torch.stack(rows) for rows in out]


@torch.no_grad()
def loop_low_rank(term, query, xs, masks):
    """HOCA Eq. 14-17 for a LowRankHOCA module."""
    n = len(xs)
    out = [[] for _ in range(n)]
    for b in range(xs[0].shape[0]):
        mapped = _mapped_all(term, query, xs, b)
        for target in range(n):
            summary = 0.0  # B_l of Eq. 16
            for j in range(term.rank):
                product = 1.0
                for i in range(n):
                    if i == target:
                        continue
                    factor = term.factors[i].double()
                    product = product * sum(
                        float(factor[j, r]) * mapped[i][r]
                        for r in range(xs[i].shape[1])
                        if masks[i][b, r]
                    )  # (I'_i)_j of Eq. 14
                summary = summary + product
            vector = term.weight_vectors[target].double()
            scores = [
                float((vector * mapped[target][r] * summary).sum())
                for r in range(xs[target].shape[1])
            ]  # Eq. 17
            out[target].append(loop_softmax(scores, masks[target][b].tolist()))
    return [torch.stack(rows) for rows in out]


@torch.no_grad()
def loop_maf(maf, query, xs, masks):
    """HOCA Eq. 18-23 for a MAF module, its terms by the loops above.

    Returns (fused (B, O), attention per modality, context per modality, beta (B, n)).
    """
    n, batch = len(xs), xs[0].shape[0]
    per_modality = [[] for _ in range(n)]
    for subset, term in zip(maf.subsets, maf.terms.values(), strict=True):
        if len(subset) == 1:
            attentions = [loop_bahdanau(term, query, xs[subset[0]], masks[subset[0]])]
        else:
            loop = loop_low_rank if maf.low_rank else loop_hoca
            attentions = loop(term, query, [xs[i] for i in subset], [masks[i] for i in subset])
        for i, attention in zip(subset, attentions, strict=True):
            per_modality[i].append(attention)  # Eq. 18
    attentions, contexts = [], []
    for i in range(n):
        theta = maf.order_weights[i].double()
        rows = []
        for b in range(batch):
            real = masks[i][b].tolist()
            scores = []
            for r in range(xs[i].shape[1]):
                terms = [float(a[b, r]) for a in per_modality[i]]
                if maf.combination == "literal":
                    score = sum(float(t) * a for t, a in zip(theta, terms, strict=True))
                else:  # the log form: theta-weighted log-attentions
                    score = sum(
                        float(t) * math.log(a) for t, a in zip(theta, terms, strict=True)
                    ) if real[r] else 0.0
                scores.append(score)
            rows.append(loop_softmax(scores, real))  # Eq. 19
        attention = torch.stack(rows)
        attentions.append(attention)
        contexts.append(
            torch.stack(
                [sum(attention[b, r] * xs[i][b, r] for r in range(xs[i].shape[1]))
                 for b in range(batch)]
            )
        )  # Eq. 5
    fused, betas = [], []
    for b in range(batch):
        scores = []
        for i in range(n):
            hidden = torch.tanh(
                maf.fusion_query.weight.double() @ query[b]
                + maf.fusion_query.bias.double()
                + maf.fusion_contexts[i].weight.double() @ contexts[i][b]
            )
            scores.append(float(maf.fusion_score.double() @ hidden))  # Eq. 21
        beta = loop_softmax(scores, [True] * n)  # Eq. 20
        betas.append(beta)
        fused.append(
            sum(beta[i] * (maf.output_projections[i].weight.double() @ contexts[i][b])
                for i in range(n))
        )  # Eq. 22-23
    return torch.stack(fused), attentions, contexts, torch.stack(betas)


@torch.no_grad()
def loop_adapter(module, xs, masks):
    """The registry adapter: pooled or learned query, then MAF (Eq. 18-23)."""
    batch = xs[0].shape[0]
    if masks is None:
        masks = [torch.ones(x.shape[:2], dtype=torch.bool) for x in xs]
    if module.query_mode == "learned":
        query = module.learned_query.double().expand(batch, -1)
    else:
        rows = []
        for b in range(batch):
            means = [
                sum(x[b, r] for r in range(x.shape[1]) if m[b, r]) / int(m[b].sum())
                for x, m in zip(xs, masks, strict=True)
            ]
            projection = module.query_projection
            rows.append(torch.tanh(projection.weight.double() @ torch.cat(means)
                                   + projection.bias.double()))
        query = torch.stack(rows)
    return loop_maf(module.maf, query, xs, masks)[0]


# ---------------------------------------------------------------------------
# Registry contract, for the two adapters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ADAPTERS)
def test_registered_with_defaults_only_and_equal_to_the_loops(name):
    assert name in polyfuse.nn.available()
    torch.manual_seed(0)
    module = polyfuse.nn.create(name, input_dims=INPUT_DIMS, out_dim=7)
    assert isinstance(module, HOCAFusion if name == "hoca" else LowRankHOCAFusion)
    assert isinstance(module, polyfuse.nn.FusionModule)
    module = module.double()
    inputs, masks = random_batch(0, dtype=F64)
    out = module(inputs, masks)
    torch.testing.assert_close(out, loop_adapter(module, inputs, masks), rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", ADAPTERS)
def test_values_in_both_dtypes_and_a_gradient_for_every_parameter(name, dtype):
    torch.manual_seed(1)
    module = polyfuse.nn.create(name, input_dims=INPUT_DIMS, out_dim=7, attention_dim=6).to(dtype)
    with torch.no_grad():
        for theta in module.maf.order_weights:
            theta.uniform_(0.5, 2.0)  # away from 1 so that theta's place is visible
    inputs, masks = random_batch(1, dtype=dtype)
    out = module(inputs, masks)
    assert out.dtype == dtype
    expected = loop_adapter(module, [x.double() for x in inputs], masks)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=tolerance)
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
    torch.manual_seed(3)
    module = polyfuse.nn.create(name, input_dims=[3, 2], out_dim=4).double()
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 3, generator=gen, dtype=F64), torch.randn(2, 6, 2, generator=gen,
                                                                       dtype=F64)]
    out = module(inputs)
    # a (B, d) input is one step: its attention is 1, whatever the terms say
    expected = loop_adapter(module, [inputs[0][:, None], inputs[1]], None)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


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


def test_hoca_module_uses_the_leading_slice_of_its_weights():
    torch.manual_seed(4)
    module = HOCA(INPUT_DIMS, 3, attention_dim=5, max_lengths=[6, 9, 4]).double()
    assert [tuple(w.shape) for w in module.weights] == [(9, 4), (6, 4), (6, 9)]
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(4, dtype=F64)
    output = module(query, inputs, masks)
    expected = loop_hoca(module, query, inputs, masks)  # reads weight[r_rest] at real steps
    for target in range(3):
        torch.testing.assert_close(output.attention[target], expected[target], rtol=0, atol=1e-12)
        context = torch.stack(
            [sum(expected[target][b, r] * inputs[target][b, r] for r in range(LENGTHS[target]))
             for b in range(4)]
        )  # Eq. 5
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
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)  # README note 9
    # with a learned w^{I_l} (Eq. 17), against the loops of Eq. 14-17
    with torch.no_grad():
        for vector in low_rank.weight_vectors:
            vector.normal_()
    expected = loop_low_rank(low_rank, query, inputs, masks)
    for got, want in zip(low_rank(query, inputs, masks).attention, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_exact_module_refuses_huge_weights_and_default_lengths():
    with pytest.raises(
        ValueError, match=r"weight tensor of modality 0 would have 100,000,000,000,000 entries"
    ):
        HOCA([2] * 8, 3, max_lengths=100)
    assert [default_exact_max_length(n) for n in range(2, 9)] == [64, 64, 64, 32, 16, 10, 7]
    assert HOCA([2] * 5, 3).max_lengths == [32] * 5


def test_low_rank_fusion_handles_eight_modalities_of_length_100():
    torch.manual_seed(6)
    module = LowRankHOCAFusion([8] * 8, 4, orders="UT", attention_dim=16)
    inputs, masks = random_batch(6, [8] * 8, [100] * 8, batch=2)
    start = time.perf_counter()
    out = module(inputs, masks)
    out.sum().backward()
    assert time.perf_counter() - start < 10.0
    expected = loop_adapter(module.double(), [x.double() for x in inputs], masks)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)


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


@pytest.mark.parametrize("combination", ["log", "literal"])
@pytest.mark.parametrize("low_rank", [False, True])
def test_maf_is_eq_18_to_23_of_its_terms(low_rank, combination):
    torch.manual_seed(7)
    maf = MAF(INPUT_DIMS, 3, 4, orders="UBT", low_rank=low_rank, attention_dim=5, rank=2,
              combination=combination).double()
    with torch.no_grad():
        for theta in maf.order_weights:
            theta.normal_()
        if low_rank:
            for term in maf.terms.values():
                for vector in getattr(term, "weight_vectors", []):
                    vector.normal_()
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(7, dtype=F64)
    details = maf(query, inputs, masks, return_details=True)
    torch.testing.assert_close(maf(query, inputs, masks), details.fused, rtol=0, atol=0)
    for subset, term in zip(maf.subsets, maf.terms.values(), strict=True):
        assert isinstance(
            term, BahdanauAttention if len(subset) == 1 else LowRankHOCA if low_rank else HOCA
        )
    assert [len(t) for t in maf.order_weights] == [4, 4, 4]  # U, two B, T per modality
    fused, attentions, contexts, beta = loop_maf(maf, query, inputs, masks)
    for got, expected in zip(details.attention, attentions, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    for got, expected in zip(details.context, contexts, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(details.modality_weights, beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(details.fused, fused, rtol=0, atol=1e-12)


def test_eq_19_literal_is_nearly_uniform_and_the_log_form_keeps_a_single_term():
    """With one (unary) term and theta = 1: the log form returns the term's attention,
    the literal form softmax(alpha), within 1/T of uniform per step."""
    torch.manual_seed(8)
    inputs, masks = random_batch(8, dtype=F64)
    query = torch.randn(4, 3, dtype=F64)
    forms = {c: MAF(INPUT_DIMS, 3, 4, orders="U", attention_dim=5, combination=c).double()
             for c in ("log", "literal")}
    forms["literal"].load_state_dict(forms["log"].state_dict())
    with torch.no_grad():
        for term in forms["log"].terms.values():
            term.score_vector.mul_(8.0)  # sharp unary attention
    forms["literal"].load_state_dict(forms["log"].state_dict())
    log_form = forms["log"](query, inputs, masks, return_details=True).attention
    literal = forms["literal"](query, inputs, masks, return_details=True).attention
    for i, term in enumerate(forms["log"].terms.values()):
        unary = loop_bahdanau(term, query, inputs[i], masks[i])
        torch.testing.assert_close(log_form[i], unary, rtol=0, atol=1e-12)
        assert float(unary[0].max()) > 0.5  # the term itself is far from uniform
        expected = torch.stack([loop_softmax(unary[b].tolist(), masks[i][b].tolist())
                                for b in range(4)])  # Eq. 19 as printed
        torch.testing.assert_close(literal[i], expected, rtol=0, atol=1e-12)
        count = masks[i].sum(-1, keepdim=True)
        # softmax of values in [0, 1]: every weight within a factor e of 1/T
        real = literal[i][masks[i]]
        bound = (1.0 / count).expand_as(masks[i])[masks[i]]
        assert bool((real <= math.e * bound).all()) and bool((real >= bound / math.e).all())
    with pytest.raises(ValueError, match="combination must be one of"):
        MAF(INPUT_DIMS, 3, 4, combination="mean")


def test_maf_orders_choose_the_terms():
    torch.manual_seed(9)
    unary = MAF(INPUT_DIMS, 3, 4, orders="U").double()
    assert all(isinstance(t, BahdanauAttention) for t in unary.terms.values())
    assert [tuple(t.shape) for t in unary.order_weights] == [(1,), (1,), (1,)]
    query = torch.randn(4, 3, dtype=F64)
    inputs, masks = random_batch(8, dtype=F64)
    # no high-order term: any length is fine, since only HOCA weights are per step
    long_inputs = [torch.randn(1, 600, d, dtype=F64) for d in INPUT_DIMS]
    long_masks = [torch.ones(1, 600, dtype=torch.bool)] * 3
    torch.testing.assert_close(
        unary(query[:1], long_inputs), loop_maf(unary, query[:1], long_inputs, long_masks)[0],
        rtol=0, atol=1e-12,
    )
    ub = MAF(INPUT_DIMS, 3, 4, orders="UB", low_rank=True).double()
    assert list(ub.terms) == ["0", "1", "2", "0_1", "0_2", "1_2"]
    torch.testing.assert_close(
        ub(query, inputs, masks), loop_maf(ub, query, inputs, masks)[0], rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match=r"query has shape \(4, 2\)"):
        ub(query[:, :2], inputs, masks)


def test_combine_attentions_defaults_to_the_log_form():
    gen = torch.Generator().manual_seed(10)
    attentions = torch.rand(2, 4, 3, generator=gen, dtype=F64).softmax(dim=1)
    theta = torch.tensor([0.5, 1.5, -0.25], dtype=F64)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    attentions = attentions * mask[..., None]
    got = combine_attentions(attentions, theta, mask)  # no combination given
    for b in range(2):
        real = mask[b].tolist()
        scores = [sum(float(theta[k]) * math.log(float(attentions[b, r, k])) for k in range(3))
                  if real[r] else 0.0 for r in range(4)]
        torch.testing.assert_close(got[b], loop_softmax(scores, real), rtol=0, atol=1e-12)


def test_module_errors_name_the_module():
    inputs, masks = random_batch(11, dtype=F64)
    query = torch.randn(4, 3, dtype=F64)
    maf = MAF(INPUT_DIMS, 3, 4, orders="UB").double()
    with pytest.raises(ValueError, match=r"^MAF: query has shape \(4, 2\), expected"):
        maf(query[:, :2], inputs, masks)
    short = [3, 3, 3]
    with pytest.raises(ValueError, match=r"^HOCA: modality 0 has 5 time steps, more than "):
        HOCA(INPUT_DIMS, 3, max_lengths=short).double()(query, inputs, masks)
    with pytest.raises(ValueError, match=r"^LowRankHOCA: modality 0 has 5 time steps"):
        LowRankHOCA(INPUT_DIMS, 3, max_lengths=short).double()(query, inputs, masks)
    # max_elements bounds the weights at construction and one sample's correlation tensor
    # in forward: 5 x 7 x 3 = 105 elements plus the (d, 5, 3) intermediate, 60, > 150
    exact = HOCA(INPUT_DIMS, 3, attention_dim=4, max_lengths=[5, 7, 3], max_elements=150)
    with pytest.raises(ValueError, match=r"^hoca_attention_all_targets: .* needs 165 elements"):
        exact.double()(query, inputs, masks)


def test_helpers_and_forward_checks_name_the_module():
    assert parse_orders(3, 4) == [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]  # an int order
    with pytest.raises(ValueError, match=r"^orders: give at least one order, e.g. 'UBT'$"):
        parse_orders([], 3)
    assert default_exact_max_length(22) == 1  # 2**21 > 2**20: only length 1 fits
    inputs, masks = random_batch(12, dtype=F64)
    query = torch.randn(4, 3, dtype=F64)
    wrong = [inputs[0], inputs[1][..., :3], inputs[2]]
    with pytest.raises(ValueError, match=r"^MAF: modality 1 has feature size 3"):
        MAF(INPUT_DIMS, 3, 4, orders="U").double()(query, wrong, masks)
    with pytest.raises(ValueError, match=r"^HOCA: modality 1 has feature size 3"):
        HOCA(INPUT_DIMS, 3, max_lengths=8).double()(query, wrong, masks)
    low_rank = LowRankHOCA(INPUT_DIMS, 3, max_lengths=8).double()
    with pytest.raises(ValueError, match=r"^LowRankHOCA: query has shape \(4,\), expected"):
        low_rank(query[:, 0], inputs, masks)
    with pytest.raises(ValueError, match=r"^LowRankHOCA: query has shape list, expected"):
        low_rank(query.tolist(), inputs, masks)
    for bad in ([4, 4], 0, [4, 0, 4]):
        with pytest.raises(ValueError, match=r"^HOCA: max_lengths must be a positive int or 3"):
            HOCA(INPUT_DIMS, 3, max_lengths=bad)
    assert HOCA([2, 2], 3, max_lengths=1).max_lengths == [1, 1]


# ---------------------------------------------------------------------------
# Construction: the documented initialisation, defaults, reprs and full messages
# ---------------------------------------------------------------------------


def test_initialisation_follows_the_documented_scales():
    """HOCA weights N(0, 1/P) over their P entries, Low-Rank factors N(0, 1/T_i), score
    vectors N(0, 1/d), w^{I_l} = 1_d (sample moments of large draws, seeded)."""
    torch.manual_seed(12)
    exact = HOCA([2, 2, 2], 3, attention_dim=4, max_lengths=[40, 50, 60])
    for weight, entries in zip(exact.weights, [3000, 2400, 2000], strict=True):
        assert float(weight.detach().std()) == pytest.approx(1 / math.sqrt(entries), rel=0.05)
        assert abs(float(weight.detach().mean())) < 3 / entries
    low_rank = LowRankHOCA([2, 2], 3, attention_dim=4, rank=300, max_lengths=[40, 90])
    for factor, length in zip(low_rank.factors, [40, 90], strict=True):
        assert factor.shape == (300, length)
        assert float(factor.detach().std()) == pytest.approx(1 / math.sqrt(length), rel=0.05)
    assert [tuple(v.shape) for v in low_rank.weight_vectors] == [(4,), (4,)]
    unary = BahdanauAttention(3, 2, attention_dim=4000)
    assert float(unary.score_vector.detach().std()) == pytest.approx(1 / math.sqrt(4000), rel=0.05)
    maf = MAF([2, 3], 2, 3, orders="U", attention_dim=5, fusion_dim=4000)
    assert float(maf.fusion_score.detach().std()) == pytest.approx(1 / math.sqrt(4000), rel=0.05)
    assert maf.fusion_query.out_features == 4000 and maf.fusion_contexts[1].in_features == 3
    assert all(bool((theta == 1).all()) for theta in MAF([2, 3], 2, 3, orders="UB").order_weights)


def test_defaults_of_the_modules():
    unary = BahdanauAttention(3, 2)
    assert unary.query_projection.out_features == 64 and unary.feature_projection.bias is None
    exact = HOCA([3, 2], 5)
    assert exact.attention_dim == 64 and exact.max_lengths == [64, 64] and exact.max_elements == 2**26
    assert exact.mapping.query_projections[1].in_features == 5
    assert exact.mapping.feature_projections[1].in_features == 2
    assert exact.mapping.query_projections[1].out_features == 64
    low_rank = LowRankHOCA([3, 2], 5)
    assert low_rank.rank == 1 and low_rank.attention_dim == 64 and low_rank.max_lengths == [512, 512]
    maf = MAF([3, 2], 5, 4)
    assert maf.subsets == [(0,), (1,), (0, 1)] and not maf.low_rank and maf.combination == "log"
    assert maf.max_lengths == [64, 64] and maf.terms["0_1"].max_elements == 2**26
    assert maf.fusion_query.out_features == 64 and maf.terms["0"].score_vector.shape == (64,)
    assert MAF([3, 2], 5, 4, orders="U").max_lengths == [64, 64]
    assert MAF([3, 2], 5, 4, low_rank=True).max_lengths == [512, 512]
    assert MAF([3, 2], 5, 4, low_rank=True, rank=2).terms["0_1"].rank == 2
    assert MAF([3, 2, 2, 2, 2], 5, 4, orders=[1, 5]).max_lengths == [32] * 5  # the largest subset
    assert MAF([3, 2], 5, 4, max_elements=5000, max_lengths=[40, 50]).terms["0_1"].max_elements == 5000
    hoca = polyfuse.nn.create("hoca", input_dims=[3, 2], out_dim=4)
    assert hoca.maf.subsets == [(0,), (1,), (0, 1)] and hoca.query_mode == "pooled"
    assert hoca.query_projection.out_features == 32 and hoca.maf.terms["0"].score_vector.shape == (32,)
    assert hoca.maf.combination == "log" and not hoca.maf.low_rank and hoca.maf.out_dim == 4
    assert hoca.maf.owner == "HOCAFusion" and hoca.maf.terms["0_1"].max_elements == 2**26
    low = polyfuse.nn.create("lowrank_hoca", input_dims=[3, 2, 4], out_dim=4)
    assert low.maf.subsets[-1] == (0, 1, 2) and low.maf.low_rank and low.maf.terms["0_1_2"].rank == 1
    assert low.maf.terms["0"].score_vector.shape == (32,) and low.query_mode == "pooled"
    assert low.maf.query_dim == 32 and low.maf.combination == "log" and low.maf.owner == "LowRankHOCAFusion"
    maf_fusion = polyfuse.nn.create("maf", input_dims=[3, 2], out_dim=4)
    assert maf_fusion.maf.subsets == [(0,), (1,), (0, 1)] and not maf_fusion.maf.low_rank
    assert maf_fusion.maf.terms["0_1"].max_elements == 2**26 and maf_fusion.maf.query_dim == 32
    assert polyfuse.nn.create("maf", input_dims=[3, 2], out_dim=4, low_rank=True).maf.terms["0_1"].rank == 1


def test_adapters_pass_every_option_to_maf():
    for name in ("hoca", "lowrank_hoca", "maf"):
        options = {"orders": "UT", "attention_dim": 6, "query": "learned", "query_dim": 5, "max_lengths": [7, 8, 9],
                       "combination": "literal"}
        if name == "hoca":
            options["max_elements"] = 10_000
        if name != "hoca":
            options["rank"] = 2
        module = polyfuse.nn.create(name, input_dims=[3, 2, 4], out_dim=4, **options)
        maf = module.maf
        assert maf.subsets == [(0,), (1,), (2,), (0, 1, 2)] and maf.combination == "literal"
        assert maf.query_dim == 5 and module.learned_query.shape == (5,) and module.query_mode == "learned"
        assert maf.max_lengths == [7, 8, 9] and maf.terms["0"].score_vector.shape == (6,)
        assert maf.low_rank == (name == "lowrank_hoca")
        if name == "hoca":
            assert maf.terms["0_1_2"].max_elements == 10_000
        if name != "hoca":
            assert getattr(maf.terms["0_1_2"], "rank", 2) == 2
    with pytest.raises(ValueError, match=r"^HOCAFusion: query must be 'pooled' or 'learned', got 'mean'$"):
        HOCAFusion([3, 2], 5, query="mean")
    with pytest.raises(ValueError, match=r"^LowRankHOCAFusion: combination must be one of \('log', 'literal'\)"):
        LowRankHOCAFusion([3, 2], 5, combination="mean")


def test_reprs_name_the_configuration():
    assert repr(HOCA([3, 2], 5, attention_dim=4, max_lengths=[6, 7])).startswith(
        "HOCA(\n  input_dims=[3, 2], query_dim=5, attention_dim=4, max_lengths=[6, 7]\n")
    assert "input_dims=[3, 2], query_dim=5, attention_dim=4, max_lengths=[6, 7], rank=2\n" in repr(
        LowRankHOCA([3, 2], 5, attention_dim=4, rank=2, max_lengths=[6, 7]))
    assert repr(MAF([3, 2], 5, 4, orders="U", max_lengths=9)).startswith(
        "MAF(\n  input_dims=[3, 2], query_dim=5, out_dim=4, subsets=[(0,), (1,)], low_rank=False, "
        "max_lengths=[9, 9], combination='log'\n")
    assert repr(HOCAFusion([3, 2], 5, query="learned")).startswith(
        "HOCAFusion(\n  input_dims=[3, 2], out_dim=5, query='learned'\n")


def test_construction_messages_name_the_argument():
    with pytest.raises(ValueError, match=r"^HOCA needs at least 2 modalities, got input_dims=\[3\]$"):
        HOCA([3], 2)
    with pytest.raises(ValueError, match=r"^LowRankHOCA needs at least 2 modalities"):
        LowRankHOCA([3], 2)
    with pytest.raises(ValueError, match=r"^LowRankHOCA: rank must be positive, got 0$"):
        LowRankHOCA([3, 2], 2, rank=0)
    with pytest.raises(
        ValueError,
        match=r"^HOCA: the weight tensor of modality 2 would have 12 entries \(max_lengths \[3, 4, 2\]\), more "
        r"than max_elements=11; lower max_lengths, raise max_elements or use LowRankHOCA$",
    ):
        HOCA([2, 2, 2], 3, max_lengths=[3, 4, 2], max_elements=11)
    assert HOCA([2, 2, 2], 3, max_lengths=[3, 4, 2], max_elements=12).max_elements == 12  # 3 x 4 fits exactly
    with pytest.raises(ValueError, match=r"^LowRankHOCA: max_lengths must be a positive int or 2 positive ints, "
                                         r"got \[3, 4, 5\]$"):
        LowRankHOCA([3, 2], 2, max_lengths=[3, 4, 5])
    for kwargs in ({"query_dim": 0}, {"out_dim": 0}, {"attention_dim": 0}, {"input_dims": []}):
        arguments = {"input_dims": [3, 2], "query_dim": 2, "out_dim": 4, **kwargs}
        with pytest.raises(ValueError, match=r"^MAF: sizes must be positive and at least one modality is needed, "
                                             r"got input_dims=\[.*\], query_dim=-?\d, out_dim=\d$"):
            MAF(**arguments)
    with pytest.raises(ValueError, match=r"^MAF: combination must be one of \('log', 'literal'\) \(HOCA Eq. 19\), "
                                         r"got 'mean'$"):
        MAF([3, 2], 2, 4, combination="mean")
    with pytest.raises(ValueError, match=r"^MAF: combination must be one of \('log', 'literal'\) \(HOCA Eq. 19\), "
                                         r"got 'mean'$"):
        combine_attentions(torch.ones(1, 2, 1), torch.ones(1), torch.ones(1, 2, dtype=torch.bool), "mean")
    with pytest.raises(ValueError, match=r"^orders: unknown order 'x' in 'UX'; use the letters U, B, T, the names "
                                         r"'unary', 'binary', 'ternary', or ints k \(subsets of k modalities\)$"):
        parse_orders("UX", 3)
    with pytest.raises(ValueError, match=r"^orders: unknown order True in \[True\]"):
        parse_orders([True], 3)
    with pytest.raises(ValueError, match=r"^orders: order 0 needs 0 modalities, there are 3$"):
        parse_orders([0], 3)
    assert parse_orders([" Unary ", "B"], 2) == [(0,), (1,), (0, 1)]
    assert parse_orders(" t ", 2) == [(0, 1)] and parse_orders("TERNARY", 3) == [(0, 1, 2)]
    assert parse_orders(["u", "b", "t"], 3) == parse_orders("UBT", 3)


def test_forward_messages_name_the_module_and_the_limit():
    inputs, masks = random_batch(13, dtype=F64)
    query = torch.randn(4, 3, dtype=F64)
    module = HOCA(INPUT_DIMS, 3, max_lengths=[5, 6, 3]).double()
    with pytest.raises(ValueError, match=r"^HOCA: modality 1 has 7 time steps, more than max_lengths\[1\] = 6; "
                                         r"build the module with a larger max_lengths \(its weights have one entry "
                                         r"per time step\)$"):
        module(query, inputs, masks)
    with pytest.raises(ValueError, match=r"^HOCA: query has shape \(4, 2\), expected \(B, d_q\) = \(4, 3\)$"):
        module(query[:, :2], inputs, masks)
    with pytest.raises(ValueError, match=r"^HOCA: query has shape \(3, 3\), expected \(B, d_q\) = \(4, 3\)$"):
        module(query[:3], inputs, masks)
    with pytest.raises(ValueError, match=r"^HOCA: query has shape \(1, 4, 3\), expected"):
        module(query[None], inputs, masks)


def test_maf_with_one_modality_and_the_half_precision_paths():
    torch.manual_seed(14)
    single = MAF([4], 3, 2, orders="U", attention_dim=5).double()
    (x,), (mask,) = random_batch(14, [4], [6], batch=3, dtype=F64)
    query = torch.randn(3, 3, dtype=F64)
    torch.testing.assert_close(single(query, [x], [mask]), loop_maf(single, query, [x], [mask])[0],
                               rtol=0, atol=1e-12)
    assert single(query[:0], [x[:0]], [mask[:0]]).shape == (0, 2)
    with pytest.raises(ValueError, match=r"^MAF: query has shape \(3, 2\), expected \(B, d_q\) = \(3, 3\)$"):
        single(query[:, :2], [x], [mask])
    # a float16 query or float16 inputs with float32 weights: computed in float32
    maf = MAF([4, 2], 3, 2, orders="UB", attention_dim=5, max_lengths=6)
    inputs, masks = random_batch(15, [4, 2], [6, 5], batch=3)
    query = torch.randn(3, 3)
    rounded = [x.half().float() for x in inputs]
    expected = maf(query.half().float(), inputs, masks)
    torch.testing.assert_close(maf(query.half(), inputs, masks), expected.half(), rtol=0, atol=0)
    expected = maf(query, rounded, masks)
    got = maf(query, [x.half() for x in inputs], masks)
    assert got.dtype == torch.float32  # the query's dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_fuse_prepared_checks_the_query_and_the_lengths_under_the_owners_name():
    """fuse_prepared (the decoder's and the adapters' entry) checks the query and the
    lengths itself, naming the modality by its index among all modalities."""
    torch.manual_seed(16)
    maf = MAF(INPUT_DIMS, 3, 4, orders=[2], attention_dim=4, max_lengths=[5, 7, 2]).double()
    inputs, masks = random_batch(16, dtype=F64)
    query = torch.randn(4, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"^MAF: modality 2 has 3 time steps, more than max_lengths\[2\] = 2; "):
        maf.fuse_prepared(query, inputs, masks)
    cut = [inputs[0], inputs[1], inputs[2][:, :2]]
    cut_masks = [masks[0], masks[1], masks[2][:, :2] | (torch.arange(2) == 0)]
    with pytest.raises(ValueError, match=r"^MAF: query has shape \(4, 2\), expected \(B, d_q\) = \(4, 3\)$"):
        maf.fuse_prepared(query[:, :2], cut, cut_masks)
    details = maf.fuse_prepared(query, cut, cut_masks)
    torch.testing.assert_close(details.fused, loop_maf(maf, query, cut, cut_masks)[0], rtol=0, atol=1e-12)
    adapter = HOCAFusion(INPUT_DIMS, 4, orders="U", attention_dim=4, max_lengths=[5, 6, 2])  # unary only:
    adapter(*random_batch(16))  # no length limit applies
    with pytest.raises(ValueError, match=r"^HOCAFusion: modality 1 has 7 time steps, more than max_lengths\[1\] = 6"):
        HOCAFusion(INPUT_DIMS, 4, orders="UB", attention_dim=4, max_lengths=[5, 6, 3])(*random_batch(16))


@pytest.mark.parametrize("low_rank", [False, True])
def test_maf_passes_lengths_sizes_and_rank_to_every_term(low_rank):
    maf = MAF([3, 2, 4], 5, 1, orders="UBT", low_rank=low_rank, attention_dim=1, max_lengths=[7, 8, 9])
    assert maf.out_dim == 1  # out_dim and attention_dim of 1 are valid
    for subset in [(0, 1), (0, 2), (1, 2), (0, 1, 2)]:
        term = maf.terms["_".join(map(str, subset))]
        assert term.max_lengths == [[7, 8, 9][i] for i in subset] and term.attention_dim == 1
        if low_rank:
            assert term.rank == 1  # MAF's default rank
    with pytest.raises(ValueError, match=r"^MAF: max_lengths must be a positive int or 3 positive ints"):
        MAF([3, 2, 4], 5, 4, max_lengths=[7, 8])
