"""had mode with the LSC logits computed exactly (``exact_lsc``), against a brute-force
oracle written from MAN Eq. 7, 8 and 11 over every tuple of time steps."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from polyfuse.functional import lsc_sum
from polyfuse.functional import multilinear as ML

DOUBLE = torch.float64


def chunk_of(mask, chunks):
    """Relative chunk of each real step of one modality: floor(rank C / real steps)."""
    real = int(mask.sum())
    chunk, rank = [], 0
    for is_real in mask.tolist():
        chunk.append(rank * chunks // real if is_real else None)
        rank += int(is_real)
    return chunk


def code(chunk, chunks, scale):
    """E_t of Eq. 8: +scale at positions i <= c(t), -scale after."""
    return torch.tensor([scale if i <= chunk else -scale for i in range(chunks)], dtype=DOUBLE)


def oracle_one(features, values, masks, matrix, temperature, chunks, scale):
    """One sample: features (T_j, K') without LSC, matrix (H, K' + C) of which the first K'
    columns serve. Every real tuple t gets the log-weight
    L_t + L^LSC_t + log sum_h exp(-alpha |w_h|^2 + sqrt(1 + 2 alpha) w_h . u_t - |u_t|^2 / 2)
    with L_t the CAO logit of the scaled features, L^LSC_t = temperature sum_{j<k}
    E(c_j) . E(c_k) exact, and u_t the sum of the centred scaled features (gerf with
    antithetic rows, as in test_had_fast's oracle, on the learned features only)."""
    dim = features[0].shape[-1]
    rows = matrix[:, :dim]
    count = rows.shape[0]
    kept = (count + 1) // 2
    rows = torch.cat([rows[:kept], -rows[: count - kept]])
    scaled = [a * math.sqrt(temperature) for a in features]
    means = [a[m].mean(0) for a, m in zip(scaled, masks, strict=True)]
    alpha = sum((a[m] - c).pow(2).sum(-1).mean() for a, m, c in zip(scaled, masks, means, strict=True)) / dim
    factor = torch.sqrt(1 + 2 * alpha)
    chunk = [chunk_of(m, chunks) for m in masks]
    real = [torch.nonzero(m).squeeze(-1).tolist() for m in masks]
    tuples = list(itertools.product(*real))
    log_weights = []
    for index in tuples:
        logit = 0.0
        for j, k in itertools.combinations(range(len(index)), 2):
            lsc = code(chunk[j][index[j]], chunks, scale) @ code(chunk[k][index[k]], chunks, scale)
            logit = logit + scaled[j][index[j]] @ scaled[k][index[k]] + temperature * lsc
        u = sum(scaled[j][t] - means[j] for j, t in enumerate(index))
        exponents = -alpha * (rows * rows).sum(-1) + factor * (rows @ u) - 0.5 * (u @ u)
        log_weights.append(logit + torch.logsumexp(exponents, 0))
    attention = torch.softmax(torch.stack(log_weights), 0)
    output = torch.zeros(values[0].shape[-1], dtype=DOUBLE)
    marginals = [torch.zeros(len(m), dtype=DOUBLE) for m in masks]
    for weight, index in zip(attention, tuples, strict=True):
        product = torch.ones_like(output)
        for j, t in enumerate(index):
            product = product * values[j][t]
            marginals[j] = marginals[j].index_add(0, torch.tensor([t]), weight.reshape(1))
        output = output + weight * product
    return output, marginals


def make_case(lengths, batch=2, heads=2, feature_dim=3, value_dim=2, num_features=5, chunks=3, seed=0,
              padded=True):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    features = torch.randn(batch, heads, total, feature_dim, generator=generator, dtype=DOUBLE) * 0.6
    values = torch.randn(batch, heads, total, value_dim, generator=generator, dtype=DOUBLE)
    mask = torch.rand(batch, 1, total, generator=generator) > 0.3
    for start in itertools.accumulate([0, *lengths[:-1]]):
        mask[..., start] = True  # a real step in every modality
    if not padded:
        mask[:] = True
    matrix = torch.randn(heads, num_features, feature_dim + chunks, generator=generator, dtype=DOUBLE)
    return features, values, mask, matrix


def fast(features, values, mask, matrix, lengths, chunks, scale, temperature=0.6, attention=True, **options):
    return ML.stacked_multilinear_attention(
        features, values, lengths, mask, mode="had", random_matrix=matrix, temperature=temperature,
        return_attention=attention, chunks=chunks, lsc_scale=scale, **options)


def oracle(features, values, mask, matrix, lengths, chunks, scale, temperature=0.6):
    outputs, marginals = [], [[] for _ in lengths]
    for b, g in itertools.product(range(features.shape[0]), range(features.shape[1])):
        pieces = [x[b, g] for x in (features, values)]
        split = [p.split(lengths) for p in pieces]
        masks = mask[b, 0].split(lengths)
        output, marginal = oracle_one(*split, masks, matrix[g], temperature, chunks, scale)
        outputs.append(output)
        for j, mg in enumerate(marginal):
            marginals[j].append(mg)
    shape = features.shape[:2]
    return (torch.stack(outputs).reshape(*shape, -1), [torch.stack(mg).reshape(*shape, -1) for mg in marginals])


@pytest.fixture(params=["dense", "histograms"])
def algorithm(request, monkeypatch):
    """Either way of summing over the chunk tuples, forced (lsc_sum.DENSE_ADVANTAGE)."""
    monkeypatch.setattr(lsc_sum, "DENSE_ADVANTAGE", math.inf if request.param == "dense" else 0.0)
    return request.param


@pytest.mark.parametrize(("lengths", "chunks"), [((3, 4), 2), ((2, 3, 4), 3), ((3, 3, 3), 4), ((2, 3, 2, 3), 2),
                                                 ((1, 2, 3, 2, 1), 3)])
@pytest.mark.parametrize("padded", [True, False])
def test_exact_lsc_equals_the_tuple_oracle(lengths, chunks, padded, algorithm):
    features, values, mask, matrix = make_case(lengths, chunks=chunks, padded=padded)
    output, marginals = fast(features, values, mask if padded else None, matrix, lengths, chunks, 0.8)
    expected_output, expected_marginals = oracle(features, values, mask, matrix, lengths, chunks, 0.8)
    torch.testing.assert_close(output, expected_output, rtol=1e-10, atol=1e-10)
    for marginal, expected in zip(marginals, expected_marginals, strict=True):
        torch.testing.assert_close(marginal, expected.flatten(-1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", [True, False])  # autograd path / the custom backward
@pytest.mark.parametrize("padded", [True, False])
def test_exact_lsc_gradients_equal_the_oracle_gradients(attention, padded, algorithm):
    lengths, chunks = (2, 3, 3), 3
    features, values, mask, matrix = make_case(lengths, batch=2, value_dim=3, chunks=chunks, padded=padded)
    weights = torch.randn((*features.shape[:2], values.shape[-1]), dtype=DOUBLE)
    grads = []
    for function in (fast, oracle):
        a, v, w = (x.clone().requires_grad_() for x in (features, values, matrix))
        options = {"attention": attention} if function is fast else {}
        output = function(a, v, mask, w, lengths, chunks, 0.7, **options)
        output = output[0] if isinstance(output, tuple) else output
        grads.append(torch.autograd.grad((output * weights).sum(), (a, v, w)))
    for actual, expected in zip(*grads, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-10)


def test_estimated_lsc_equals_the_features_with_the_codes_appended():
    """exact_lsc=False: the LSC vectors are appended and estimated like the rest, which is
    multilinear_attention of the features with lsc_encoding_from_mask appended."""
    lengths, chunks, scale = (3, 4, 2), 3, 0.9
    features, values, mask, matrix = make_case(lengths, chunks=chunks)
    output = fast(features, values, mask, matrix, lengths, chunks, scale, attention=False, exact_lsc=False)
    pieces, with_codes = mask.split(lengths, -1), []
    for a, m in zip(features.split(lengths, -2), pieces, strict=True):
        codes = ML.lsc_encoding_from_mask(m, chunks, scale, dtype=DOUBLE).expand(*a.shape[:-1], chunks)
        with_codes.append(torch.cat([a, codes], -1))
    expected = ML.multilinear_attention(with_codes, list(values.split(lengths, -2)), list(pieces), mode="had",
                                        random_matrix=matrix, temperature=0.6)
    torch.testing.assert_close(output, expected, rtol=1e-12, atol=1e-12)


def test_beyond_the_work_limit_the_lsc_part_is_estimated(monkeypatch):
    lengths, chunks = (3, 4, 2), 3
    features, values, mask, matrix = make_case(lengths, chunks=chunks)
    estimated = fast(features, values, mask, matrix, lengths, chunks, 0.9, attention=False, exact_lsc=False)
    exact = fast(features, values, mask, matrix, lengths, chunks, 0.9, attention=False)
    assert (exact - estimated).abs().max() > 1e-3  # the two paths differ here
    work = lsc_sum.lsc_sum_of(lengths, chunks, 0.9, 0.6, DOUBLE, "cpu").plan.work
    monkeypatch.setattr(ML, "EXACT_LSC_WORK", work - 1)
    beyond = fast(features, values, mask, matrix, lengths, chunks, 0.9, attention=False)
    torch.testing.assert_close(beyond, estimated, rtol=0, atol=0)


def test_exact_mode_with_chunks_appends_the_codes():
    lengths, chunks, scale = (2, 3), 2, 1.1
    features, values, mask, _ = make_case(lengths, chunks=chunks)
    output = ML.stacked_multilinear_attention(features, values, lengths, mask, mode="exact", temperature=0.6,
                                              chunks=chunks, lsc_scale=scale)
    pieces = mask.split(lengths, -1)
    with_codes = [torch.cat([a, ML.lsc_encoding_from_mask(m, chunks, scale, dtype=DOUBLE).expand(*a.shape[:-1], chunks)], -1)
                  for a, m in zip(features.split(lengths, -2), pieces, strict=True)]
    expected = ML.multilinear_attention(with_codes, list(values.split(lengths, -2)), list(pieces), mode="exact",
                                        temperature=0.6)
    torch.testing.assert_close(output, expected, rtol=1e-12, atol=1e-12)


def test_exact_lsc_lowers_the_error_against_exact_attention():
    """What exact_lsc is for: with LSC codes of the demo's size (e = 2, C = 4), estimating
    them makes the output error large; computing them exactly leaves only the learned
    features' part to the random features (measured here: about 6x lower)."""
    lengths, chunks, scale = (8, 10, 12), 4, 2.0
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(32, 2, sum(lengths), 8, generator=generator, dtype=DOUBLE) * 0.5
    values = torch.randn(32, 2, sum(lengths), 4, generator=generator, dtype=DOUBLE)
    matrix = torch.randn(2, 64, 8 + chunks, generator=generator, dtype=DOUBLE)
    temperature = 1 / math.sqrt(8)
    exact = ML.stacked_multilinear_attention(features, values, lengths, mode="exact", temperature=temperature,
                                             chunks=chunks, lsc_scale=scale)

    def error(exact_lsc):
        estimate = ML.stacked_multilinear_attention(features, values, lengths, mode="had", random_matrix=matrix,
                                                    temperature=temperature, chunks=chunks, lsc_scale=scale,
                                                    exact_lsc=exact_lsc)
        return ((estimate - exact).norm(dim=-1) / exact.norm(dim=-1)).median().item()

    assert error(True) < 0.4 * error(False)


def test_the_custom_backward_passes_gradcheck_and_refuses_double_backward():
    lengths, chunks = (2, 3), 2
    features, values, mask, matrix = make_case(lengths, batch=2, heads=1, feature_dim=2, chunks=chunks)
    inputs = tuple(x.clone().requires_grad_() for x in (features, values, matrix))
    assert torch.autograd.gradcheck(
        lambda a, v, w: fast(a, v, mask, w, lengths, chunks, 0.9, attention=False), inputs)
    output = fast(*inputs[:2], mask, inputs[2], lengths, chunks, 0.9, attention=False)
    message = r'the backward is not differentiable \(no second derivatives\); use mode="exact" for double backward$'
    with pytest.raises(RuntimeError, match=message):
        torch.autograd.grad(output.sum(), inputs[0], create_graph=True)


def test_the_custom_backward_keeps_no_random_features():
    """What the forward saves for the backward: its inputs, the chunks and the weight columns
    (F, H), never the (T, H) random features (autograd's path keeps them)."""
    lengths, chunks = (20, 30, 25), 4
    features, values, mask, _ = make_case(lengths, batch=2, heads=2, chunks=chunks)
    saved = {}
    for num_features in (8, 512):
        matrix = torch.randn(2, num_features, 3 + chunks, dtype=DOUBLE)
        a, v = features.clone().requires_grad_(), values.clone().requires_grad_()
        sizes = []

        def pack(tensor, sizes=sizes):
            sizes.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            fast(a, v, mask, matrix, lengths, chunks, 0.9, attention=False)
        saved[num_features] = max(sizes)
    assert saved[512] == 2 * (3 + 2) * 512  # the weight columns [W^T; 1; |w|^2] of both heads
    assert saved[8] == 2 * 2 * 75 * (3 + 2)  # the largest: the rows X (G, N, T, K' + 2)


@pytest.mark.parametrize("needs", ["features", "values", "matrix"])
def test_the_custom_backward_when_only_one_input_needs_a_gradient(needs):
    """Each input alone: its gradient equals the oracle's (the backward computes the
    scale's and the weights' gradients only when asked, and must when asked)."""
    lengths, chunks = (2, 3, 2), 2
    features, values, mask, matrix = make_case(lengths, batch=2, value_dim=3, chunks=chunks)
    weights = torch.randn((*features.shape[:2], values.shape[-1]), dtype=DOUBLE)
    grads = []
    for function, options in ((fast, {"attention": False}), (oracle, {})):
        inputs = {"features": features.clone(), "values": values.clone(), "matrix": matrix.clone()}
        inputs[needs].requires_grad_()
        output = function(inputs["features"], inputs["values"], mask, inputs["matrix"], lengths, chunks, 0.8,
                          **options)
        output = output[0] if isinstance(output, tuple) else output
        grads.append(torch.autograd.grad((output * weights).sum(), inputs[needs])[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-10)


def _tuple_sum_oracle(factors, chunks, scale, temperature):
    """sum_c kappa(c) prod_j F_j[c_j] over every chunk tuple, kappa from Eq. 8's vectors."""
    total = 0.0
    for c in itertools.product(range(chunks), repeat=len(factors)):
        logit = temperature * sum(code(c[j], chunks, scale) @ code(c[k], chunks, scale)
                                  for j, k in itertools.combinations(range(len(c)), 2))
        product = 1.0
        for j, chunk in enumerate(c):
            product = product * factors[j][..., chunk, :]
        total = total + torch.exp(logit) * product
    return total


@pytest.mark.parametrize(("modalities", "chunks"), [(2, 3), (3, 4), (4, 3), (5, 2), (3, 10), (6, 3), (5, 4)])
def test_tuple_sum_by_histogram_equals_the_sum_over_all_tuples(modalities, chunks, algorithm):
    """The histogram recursion against the loop over all C^m tuples, up to the constant
    kappa is scaled by (its largest, all modalities in one chunk, is 1)."""
    generator = torch.Generator().manual_seed(modalities * 10 + chunks)
    factors = [torch.rand(2, 3, chunks, 4, generator=generator, dtype=DOUBLE) for _ in range(modalities)]
    scale, temperature = 0.7, 0.4
    lsc = lsc_sum.lsc_sum_of([chunks] * modalities, chunks, scale, temperature, DOUBLE, "cpu")
    largest = temperature * scale**2 * chunks * modalities * (modalities - 1) / 2
    expected = _tuple_sum_oracle(factors, chunks, scale, temperature) * math.exp(-largest)
    torch.testing.assert_close(lsc_sum.tuple_sum(factors, lsc), expected, rtol=1e-12, atol=0)
    assert float(lsc.kappa.max()) == 1.0
    assert lsc.plan.dense == (algorithm == "dense")


def test_tuple_sum_in_blocks_of_two_rows(monkeypatch):
    """Five rows in blocks of two (the histogram recursion's largest product, 10 histograms
    x 3 chunks x 4 features, twice): three blocks, the sums of one block."""
    generator = torch.Generator().manual_seed(6)
    factors = [torch.rand(5, 3, 4, generator=generator, dtype=DOUBLE) for _ in range(4)]
    monkeypatch.setattr(lsc_sum, "DENSE_ADVANTAGE", 0.0)
    lsc = lsc_sum.lsc_sum_of([3, 3, 3, 3], 3, 0.9, 0.5, DOUBLE, "cpu")
    assert lsc.plan.sizes == (3, 6, 10, 15)
    whole = lsc_sum.tuple_sum(factors, lsc)
    blocks = []
    rows = lsc_sum._tuple_sum_rows
    monkeypatch.setattr(lsc_sum, "_tuple_sum_rows", lambda f, *a: blocks.append(len(f[0])) or rows(f, *a))
    monkeypatch.setattr(lsc_sum, "BLOCK_ELEMENTS", 2 * 10 * 3 * 4)
    torch.testing.assert_close(lsc_sum.tuple_sum(factors, lsc), whole, rtol=0, atol=0)
    assert blocks == [2, 2, 1]


def test_plans_and_kappa_are_kept_and_kappa_takes_the_factors_dtype():
    plan = lsc_sum.histogram_plan(4, [(0, 2), (0, 1, 2, 3)], "cpu")  # two steps: chunks 0 and 2
    assert lsc_sum.histogram_plan(4, [[0, 2], range(4)], "cpu") is plan  # kept per arguments
    single = lsc_sum.lsc_sum_of([2, 5], 4, 0.5, 0.3, torch.float32, "cpu")
    assert single.plan is plan and single.kappa.dtype == torch.float32
    assert lsc_sum.lsc_sum_of([2, 5], 4, 0.5, 0.3, torch.float32, "cpu").kappa is single.kappa
    assert lsc_sum.lsc_sum_of([2, 5], 4, 0.5, 0.3, DOUBLE, "cpu").kappa.dtype == DOUBLE
    with pytest.raises(ValueError, match=r"^tuple_sum: 1 factors for a plan of 2 modalities$"):
        lsc_sum.tuple_sum([torch.ones(2, 4, 3)], single)


def test_tuple_sum_blocks_of_rows_and_gradients(monkeypatch, algorithm):
    """Rows in blocks give the same sums, and gradients flow to every factor (against the
    oracle's autograd)."""
    generator = torch.Generator().manual_seed(5)
    factors = [torch.rand(5, 3, 4, generator=generator, dtype=DOUBLE, requires_grad=True) for _ in range(4)]
    lsc = lsc_sum.lsc_sum_of([3, 3, 3, 3], 3, 0.9, 0.5, DOUBLE, "cpu")
    whole = lsc_sum.tuple_sum(factors, lsc)
    monkeypatch.setattr(lsc_sum, "BLOCK_ELEMENTS", 1)  # one row per block
    blocked = lsc_sum.tuple_sum(factors, lsc)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=0)
    weights = torch.randn(whole.shape, generator=generator, dtype=DOUBLE)
    grads = torch.autograd.grad((blocked * weights).sum(), factors)
    largest = 0.5 * 0.9**2 * 3 * 4 * 3 / 2
    expected = _tuple_sum_oracle(factors, 3, 0.9, 0.5) * math.exp(-largest)
    expected_grads = torch.autograd.grad((expected * weights).sum(), factors)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-14)


def test_the_dense_contraction_is_chosen_for_few_tuples():
    """Measured rule (lsc_sum.DENSE_ADVANTAGE = 2.5): m = 3, C = 4 contracts 84 products
    densely against 60 by histogram; m = 6 (5,460 against 504) goes by histogram."""
    three = lsc_sum.histogram_plan(4, [range(4)] * 3, "cpu")
    six = lsc_sum.histogram_plan(4, [range(4)] * 6, "cpu")
    assert (three.dense_work, three.work, three.dense) == (84, 60, True)
    assert (six.dense_work, six.work, six.dense) == (5460, 504, False)


def test_occupied_chunks_and_what_an_unoccupied_chunk_costs():
    """A modality of n <= T real steps puts step r in chunk floor(r C / n): one step only
    in chunk 0, two in 0 and 2 of 4; T >= C in every chunk. A chunk no modality can occupy
    adds no histogram: six one-step modalities make one histogram and m - 1 products."""
    assert lsc_sum.occupied_chunks(1, 4) == (0,)
    assert lsc_sum.occupied_chunks(2, 4) == (0, 2)
    assert lsc_sum.occupied_chunks(3, 4) == (0, 1, 2)  # n = 3: 0, 1, 2; n = 2: 0, 2
    assert lsc_sum.occupied_chunks(4, 4) == (0, 1, 2, 3) == lsc_sum.occupied_chunks(9, 4)
    single = lsc_sum.lsc_sum_of([1] * 6, 4, 0.5, 0.5, DOUBLE, "cpu")
    assert single.plan.sizes == (1,) * 6 and single.plan.work == 6
    full = lsc_sum.lsc_sum_of([4] * 6, 4, 0.5, 0.5, DOUBLE, "cpu")
    assert full.plan.sizes == (4, 10, 20, 35, 56, 84)  # binom(j + 3, 3) histograms
    assert full.plan.work == (1 + 4 + 10 + 20 + 35 + 56) * 4
    with pytest.raises(ValueError, match=r"^every modality occupies at least one chunk, got \[\(0,\), \(\)\]$"):
        lsc_sum.histogram_plan(4, [(0,), ()], "cpu")


def test_histogram_log_kappa_is_the_pair_sum_of_eq_8():
    """log kappa of a histogram = temperature sum_{j<k} E(c_j) . E(c_k) of any tuple with
    that histogram, less the largest (hand-built tuples, Eq. 8's vectors)."""
    chunks, scale, temperature = 4, 0.7, 0.4
    histograms = torch.tensor([[3, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 2], [0, 2, 1, 0]])
    tuples = [(0, 0, 0), (0, 1, 2), (0, 3, 3), (1, 1, 2)]
    logits = torch.stack([
        temperature * sum(code(c[j], chunks, scale) @ code(c[k], chunks, scale)
                          for j, k in itertools.combinations(range(3), 2))
        for c in tuples])
    got = lsc_sum.histogram_log_kappa(histograms, scale, temperature)
    torch.testing.assert_close(got, logits - logits.max(), rtol=1e-12, atol=1e-12)
    # without the one-chunk histogram the largest logit is below the constant term, and still 0 after
    spread = lsc_sum.histogram_log_kappa(histograms[1:], scale, temperature)
    torch.testing.assert_close(spread, logits[1:] - logits[1:].max(), rtol=1e-12, atol=1e-12)


def test_resolve_mode_follows_the_budget():
    assert ML.resolve_mode("auto", ML.AUTO_EXACT_TUPLES) == "exact"
    assert ML.resolve_mode("auto", ML.AUTO_EXACT_TUPLES + 1) == "had"
    assert ML.resolve_mode("auto", 10, exact_limit=9) == "had" and ML.resolve_mode("auto", 9, exact_limit=9) == "exact"
    assert ML.resolve_mode("had", 1) == "had" and ML.resolve_mode("hadamard", 10**12) == "hadamard"
