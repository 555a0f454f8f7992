"""Bilinear attention (BAN Eq. 8 to 13) against loops over channel pairs, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.functional import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_attention_pooling,
    bilinear_logits_of_features,
    bilinear_pooling_of_features,
    bilinear_residual_glimpses,
)

DTYPE = torch.float64


def _relu(value: float) -> float:
    return max(value, 0.0)


def _dot(weight_row: torch.Tensor, vector: torch.Tensor, bias: float) -> float:
    return sum(float(w) * float(v) for w, v in zip(weight_row, vector, strict=True)) + bias


def _problem(batch=2, length_x=4, length_y=3, dim_x=5, dim_y=3, rank=6, glimpses=2, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=DTYPE)

    x_mask = torch.ones(batch, length_x, dtype=torch.bool)
    y_mask = torch.ones(batch, length_y, dtype=torch.bool)
    x_mask[1, length_x - 1 :] = False  # the last sample has padding in both inputs
    y_mask[1, length_y - 1 :] = False
    return {
        "x": randn(batch, length_x, dim_x),
        "y": randn(batch, length_y, dim_y),
        "x_weight": randn(rank, dim_x),
        "y_weight": randn(rank, dim_y),
        "glimpse_weight": randn(glimpses, rank),
        "x_bias": randn(rank),
        "y_bias": randn(rank),
        "glimpse_bias": randn(glimpses),
        "x_mask": x_mask,
        "y_mask": y_mask,
    }


def _logits_by_loops(p, x_keep=None):
    """Note 8 / BAN Eq. 9 with Eq. 13, one pair (i, j) at a time. ``x_keep`` (B, T_x, K')
    multiplies relu(U^T x_i + u)_k: the attention dropout of the reference code, which
    sits on the x side (``BCNet.forward``: ``v_ = self.dropout(self.v_net(v))``)."""
    batch, length_x, _ = p["x"].shape
    length_y = p["y"].shape[1]
    glimpses, rank = p["glimpse_weight"].shape
    out = torch.empty(batch, glimpses, length_x, length_y, dtype=DTYPE)
    for b in range(batch):
        for g in range(glimpses):
            for i in range(length_x):
                for j in range(length_y):
                    if not (p["x_mask"][b, i] and p["y_mask"][b, j]):
                        out[b, g, i, j] = -math.inf
                        continue
                    total = float(p["glimpse_bias"][g])
                    for k in range(rank):
                        u = _relu(_dot(p["x_weight"][k], p["x"][b, i], float(p["x_bias"][k])))
                        if x_keep is not None:
                            u *= float(x_keep[b, i, k])
                        v = _relu(_dot(p["y_weight"][k], p["y"][b, j], float(p["y_bias"][k])))
                        total += float(p["glimpse_weight"][g, k]) * u * v
                    out[b, g, i, j] = total
    return out


def _logits(p, **overrides):
    args = {**p, **overrides}
    return bilinear_attention_logits(
        args["x"],
        args["y"],
        args["x_weight"],
        args["y_weight"],
        args["glimpse_weight"],
        x_bias=args["x_bias"],
        y_bias=args["y_bias"],
        glimpse_bias=args["glimpse_bias"],
        x_mask=args["x_mask"],
        y_mask=args["y_mask"],
        dropout=args.get("dropout", 0.0),
        training=args.get("training", False),
    )


# Both orders of lengths: the Hadamard product with p_g goes on the shorter side.
@pytest.mark.parametrize(("length_x", "length_y"), [(4, 3), (2, 5)])
def test_logits_match_pairwise_loops(length_x, length_y):
    p = _problem(length_x=length_x, length_y=length_y)
    logits = _logits(p)
    assert logits.shape == (2, 2, length_x, length_y)
    torch.testing.assert_close(logits, _logits_by_loops(p), rtol=1e-12, atol=1e-12)


def test_map_is_one_softmax_over_the_whole_map():
    p = _problem()
    attention = bilinear_attention_map(_logits(p))
    expected = _logits_by_loops(p).exp()  # exp(-inf) = 0 at padded pairs
    expected = expected / expected.sum(dim=(-2, -1), keepdim=True)  # whole rho x phi map
    torch.testing.assert_close(attention, expected, rtol=1e-12, atol=1e-12)
    pair_mask = p["x_mask"][:, None, :, None] & p["y_mask"][:, None, None, :]
    sums = (attention * pair_mask).sum(dim=(-2, -1))
    torch.testing.assert_close(sums, torch.ones_like(sums))
    assert bool((attention.masked_select(~pair_mask.expand_as(attention)) == 0).all())
    # Not a softmax over rows alone: rows of a map do not each sum to 1.
    assert not torch.allclose(attention.sum(-1), torch.ones_like(attention.sum(-1)))


def test_map_applies_masks_given_to_it():
    p = _problem()
    unmasked = _logits(p, x_mask=None, y_mask=None)
    from_masks = bilinear_attention_map(unmasked, x_mask=p["x_mask"], y_mask=p["y_mask"])
    torch.testing.assert_close(from_masks, bilinear_attention_map(_logits(p)))


def _pooling_by_loops(p, attention, weights, pool):
    """BAN Eq. 12, f'_k = sum_ij A_ij relu(U'^T x_i)_k relu(V'^T y_j)_k, then sum pooling."""
    x_weight, y_weight, x_bias, y_bias = weights
    batch, length_x, _ = p["x"].shape
    length_y = p["y"].shape[1]
    rank = x_weight.shape[0]
    out = torch.zeros(batch, rank // pool, dtype=DTYPE)
    for b in range(batch):
        for k in range(rank):
            total = 0.0
            for i in range(length_x):
                for j in range(length_y):
                    if not (p["x_mask"][b, i] and p["y_mask"][b, j]):
                        continue
                    u = _relu(_dot(x_weight[k], p["x"][b, i], float(x_bias[k])))
                    v = _relu(_dot(y_weight[k], p["y"][b, j], float(y_bias[k])))
                    total += float(attention[b, i, j]) * u * v
            out[b, k // pool] += total  # consecutive groups of `pool` features
    return out


@pytest.mark.parametrize("pool", [1, 2])
def test_pooling_matches_pairwise_loops(pool):
    p = _problem()
    generator = torch.Generator().manual_seed(1)
    rank = 4
    weights = (
        torch.randn(rank, 5, generator=generator, dtype=DTYPE),
        torch.randn(rank, 3, generator=generator, dtype=DTYPE),
        torch.randn(rank, generator=generator, dtype=DTYPE),
        torch.randn(rank, generator=generator, dtype=DTYPE),
    )
    attention = bilinear_attention_map(_logits(p))  # (B, G, T_x, T_y)

    def pooled(att):
        return bilinear_attention_pooling(
            p["x"],
            p["y"],
            att,
            weights[0],
            weights[1],
            x_bias=weights[2],
            y_bias=weights[3],
            x_mask=p["x_mask"],
            y_mask=p["y_mask"],
            pool=pool,
        )

    per_glimpse = pooled(attention)
    assert per_glimpse.shape == (2, 2, rank // pool)
    for glimpse in range(2):
        expected = _pooling_by_loops(p, attention[:, glimpse], weights, pool)
        torch.testing.assert_close(per_glimpse[:, glimpse], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pooled(attention[:, glimpse]), expected, rtol=1e-12, atol=1e-12)


def test_padded_content_changes_nothing():
    p = _problem()
    rank_weights = (p["x_weight"][:4], p["y_weight"][:4])
    attention = bilinear_attention_map(_logits(p))
    pooled = bilinear_attention_pooling(
        p["x"], p["y"], attention, *rank_weights, x_mask=p["x_mask"], y_mask=p["y_mask"]
    )
    dirty_x, dirty_y = p["x"].clone(), p["y"].clone()
    dirty_x[~p["x_mask"]] = float("nan")
    dirty_y[~p["y_mask"]] = 1e3
    dirty_attention = attention.clone()
    dirty_attention[1, :, -1, :] = 0.7  # attention on a padded pair is ignored too
    dirty_logits = _logits(p, x=dirty_x, y=dirty_y)
    torch.testing.assert_close(dirty_logits, _logits(p), rtol=0, atol=0)
    dirty_pooled = bilinear_attention_pooling(
        dirty_x, dirty_y, dirty_attention, *rank_weights, x_mask=p["x_mask"], y_mask=p["y_mask"]
    )
    torch.testing.assert_close(dirty_pooled, pooled, rtol=0, atol=0)


def test_attention_dropout_only_in_training():
    p = _problem()
    args = (p["x"], p["y"], p["x_weight"], p["y_weight"], p["glimpse_weight"])
    torch.manual_seed(0)
    evaluated = bilinear_attention_logits(*args, dropout=0.5, training=False)
    trained = bilinear_attention_logits(*args, dropout=0.5, training=True)
    assert torch.equal(evaluated, bilinear_attention_logits(*args))
    assert torch.equal(evaluated, bilinear_attention_logits(*args, dropout=0.5))  # default: not training
    assert not torch.equal(trained, evaluated)


@pytest.mark.parametrize(("length_x", "length_y"), [(4, 3), (2, 5)])
def test_attention_dropout_drops_the_x_side_as_the_reference(length_x, length_y):
    """jnhwkim/ban-vqa bc.py: v_ = self.dropout(self.v_net(v)); q_ = self.q_net(q). The
    dropout mask has the x side's shape (B, T_x, K') and is shared by all glimpses;
    T_x != T_y, so a mask on the y side would be drawn with another shape."""
    p = _problem(length_x=length_x, length_y=length_y)
    torch.manual_seed(3)
    logits = _logits(p, dropout=0.5, training=True)
    torch.manual_seed(3)
    rank = p["x_weight"].shape[0]
    x_keep = torch.nn.functional.dropout(torch.ones(2, length_x, rank, dtype=DTYPE), 0.5, True)
    assert 0 < int((x_keep == 0).sum()) < x_keep.numel()  # the draw really drops some
    torch.testing.assert_close(logits, _logits_by_loops(p, x_keep=x_keep))


def test_gradcheck_logits_map_and_pooling():
    p = _problem(batch=2, length_x=3, length_y=2, dim_x=3, dim_y=2, rank=3, glimpses=2, seed=3)
    names = ["x", "y", "x_weight", "y_weight", "glimpse_weight", "x_bias", "y_bias"]
    tensors = [p[name].clone().requires_grad_() for name in names]

    def logits_fn(x, y, x_weight, y_weight, glimpse_weight, x_bias, y_bias):
        return bilinear_attention_logits(
            x, y, x_weight, y_weight, glimpse_weight, x_bias=x_bias, y_bias=y_bias
        )

    def map_fn(*args):  # masked: -inf logits are fine, the attention is finite
        return bilinear_attention_map(logits_fn(*args), x_mask=p["x_mask"], y_mask=p["y_mask"])

    def pooling_fn(x, y, attention, x_weight, y_weight, x_bias, y_bias):
        return bilinear_attention_pooling(
            x,
            y,
            attention,
            x_weight,
            y_weight,
            x_bias=x_bias,
            y_bias=y_bias,
            x_mask=p["x_mask"],
            y_mask=p["y_mask"],
        )

    assert torch.autograd.gradcheck(logits_fn, tensors)
    assert torch.autograd.gradcheck(map_fn, tensors)
    attention = torch.rand(2, 2, 3, 2, dtype=DTYPE, requires_grad=True)
    pooling_args = [tensors[0], tensors[1], attention, *tensors[2:4], *tensors[5:7]]
    assert torch.autograd.gradcheck(pooling_fn, pooling_args)


def _bad(p, name, value):
    return {**p, name: value}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda p: _bad(p, "x", p["x"][0]), r"x must have shape \(B, T_x, d_x\)"),
        (lambda p: _bad(p, "y", p["y"][:1]), "x has batch size 2 but y has 1"),
        (lambda p: _bad(p, "x", p["x"].float()), "x has dtype torch.float32 but y has"),
        (
            lambda p: _bad(p, "x_weight", p["x_weight"][:, :4]),
            "^bilinear_attention_logits: x_weight has shape .* feature size 5",
        ),
        (lambda p: _bad(p, "y_bias", p["y_bias"][:2]), r"^bilinear_attention_logits: y_bias must have shape \(6,\)"),
        (
            lambda p: {**p, "y_weight": p["y_weight"][:5], "y_bias": p["y_bias"][:5]},
            "x_weight has rank 6 but y_weight has rank 5; both project onto the same K' features",
        ),
        (
            lambda p: _bad(p, "glimpse_weight", p["glimpse_weight"][:, :5]),
            r"glimpse_weight has shape \(2, 5\)",
        ),
        (lambda p: _bad(p, "glimpse_weight", p["glimpse_weight"][0]), r"glimpse_weight must have shape \(G, 6\)"),
        (lambda p: _bad(p, "x_bias", p["x_bias"][:2]), r"x_bias must have shape \(6,\)"),
        (
            lambda p: _bad(p, "glimpse_bias", p["glimpse_bias"][:1]),
            r"glimpse_bias must have shape \(2,\)",
        ),
        (lambda p: _bad(p, "x_mask", p["x_mask"].int()), "x_mask must be a bool tensor"),
        (
            lambda p: _bad(p, "y_mask", p["y_mask"][:, :2]),
            r"y_mask has shape \(2, 2\), expected \(2, 3\)",
        ),
    ],
)
def test_logits_reject_bad_shapes(change, match):
    with pytest.raises(ValueError, match=match):
        _logits(change(_problem()))


def test_logits_reject_non_finite_and_empty_samples():
    p = _problem()
    x = p["x"].clone()
    x[0, 1, 2] = float("nan")
    with pytest.raises(
        ValueError, match=r"bilinear_attention_logits: x contains NaN at index \(0, 1, 2\)"
    ):
        _logits(p, x=x)
    y = p["y"].clone()
    y[1, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="y contains Inf"):
        _logits(p, y=y)
    weight = p["glimpse_weight"].clone()
    weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="glimpse_weight contains NaN"):
        _logits(p, glimpse_weight=weight)
    x_mask = p["x_mask"].clone()
    x_mask[1] = False
    with pytest.raises(ValueError, match=r"x_mask is all padding for sample\(s\) \[1\]"):
        _logits(p, x_mask=x_mask)


def test_map_and_pooling_reject_bad_input():
    p = _problem()
    logits = _logits(p)
    with pytest.raises(ValueError, match=r"logits must be a float tensor \(B, G, T_x, T_y\)"):
        bilinear_attention_map(logits[0])
    with pytest.raises(ValueError, match="logits contain NaN"):
        bilinear_attention_map(torch.full_like(logits, float("nan")))
    with pytest.raises(ValueError, match="no finite logit"):
        bilinear_attention_map(torch.full_like(logits, float("-inf")))
    attention = bilinear_attention_map(logits)
    weights = (p["x_weight"], p["y_weight"])
    with pytest.raises(ValueError, match="pool must be a positive divisor of the rank 6"):
        bilinear_attention_pooling(p["x"], p["y"], attention, *weights, pool=4)
    with pytest.raises(ValueError, match=r"attention has shape \(2, 2, 3, 3\)"):
        bilinear_attention_pooling(p["x"], p["y"], attention[:, :, 1:], *weights)
    bad_attention = attention.clone()
    bad_attention[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="attention contains NaN or Inf at a real"):
        bilinear_attention_pooling(p["x"], p["y"], bad_attention, *weights)


def test_pooling_errors_name_the_function_and_the_argument():
    p = _problem()
    attention = bilinear_attention_map(_logits(p))
    weights = (p["x_weight"], p["y_weight"])
    owner = "bilinear_attention_pooling: "
    cases = [
        ({"x_bias": p["x_bias"][:2]}, r"x_bias must have shape \(6,\)"),
        ({"y_bias": p["y_bias"][:2]}, r"y_bias must have shape \(6,\)"),
        ({"y_mask": p["y_mask"][:, :2]}, r"y_mask has shape \(2, 2\), expected \(2, 3\)"),
        ({"x_mask": p["x_mask"].int()}, "x_mask must be a bool tensor"),
    ]
    for options, match in cases:
        with pytest.raises(ValueError, match=owner + match):
            bilinear_attention_pooling(p["x"], p["y"], attention, *weights, **options)
    with pytest.raises(ValueError, match=owner + "x_weight has rank 6 but y_weight has rank 5"):
        bilinear_attention_pooling(p["x"], p["y"], attention, p["x_weight"], p["y_weight"][:5])
    with pytest.raises(ValueError, match=owner + "attention has dtype torch.float32"):
        bilinear_attention_pooling(p["x"], p["y"], attention.float(), *weights)
    x = p["x"].clone()
    x[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=owner + r"x contains NaN at index \(1, 0, 0\)"):
        bilinear_attention_pooling(x, p["y"], attention, *weights)


def test_logits_glimpse_count_and_remaining_checks():
    p = _problem()
    one = {**p, "glimpse_weight": p["glimpse_weight"][:1], "glimpse_bias": p["glimpse_bias"][:1]}
    torch.testing.assert_close(_logits(one), _logits_by_loops(one))  # a single glimpse is fine
    with pytest.raises(ValueError, match=r"glimpse_weight has shape \(0, 6\), expected \(G, 6\) with G >= 1"):
        _logits({**p, "glimpse_weight": p["glimpse_weight"][:0], "glimpse_bias": None})
    bias = p["glimpse_bias"].clone()
    bias[0] = float("nan")
    with pytest.raises(ValueError, match=r"^bilinear_attention_logits: glimpse_bias contains NaN"):
        _logits(p, glimpse_bias=bias)
    with pytest.raises(ValueError, match=r"^bilinear_attention_logits: dropout must lie in \[0, 1\)"):
        _logits(p, dropout=1.0)


def test_pooling_of_features_matches_loops_with_and_without_glimpse_axis():
    """BAN Eq. 12 on projected features: f'_k = sum_{i,j} A[i, j] x[i, k] y[j, k], by loops."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 6, generator=generator, dtype=torch.float64)
    y = torch.randn(2, 3, 6, generator=generator, dtype=torch.float64)
    maps = torch.rand(2, 2, 4, 3, generator=generator, dtype=torch.float64)
    expected = torch.zeros(2, 2, 6, dtype=torch.float64)
    for b in range(2):
        for g in range(2):
            for i in range(4):
                for j in range(3):
                    expected[b, g] += maps[b, g, i, j] * x[b, i] * y[b, j]
    torch.testing.assert_close(bilinear_pooling_of_features(x, y, maps), expected)  # pool 1
    one = bilinear_pooling_of_features(x, y, maps[:, :1])  # a glimpse axis of size 1 stays
    assert one.shape == (2, 1, 6)
    torch.testing.assert_close(one, expected[:, :1])
    torch.testing.assert_close(bilinear_pooling_of_features(x, y, maps[:, 1]), expected[:, 1])
    pooled = bilinear_pooling_of_features(x, y, maps, pool=3)  # sums of 3 consecutive features
    torch.testing.assert_close(pooled, expected.unflatten(-1, (2, 3)).sum(-1))


def test_pooling_with_biases_ignores_padded_pairs_and_keeps_a_glimpse_axis_of_one():
    """With biases relu(U'^T 0 + u) is not 0 at a padded step, so only the pair mask keeps
    the attention on a pair with one padded side (x or y) out of f'; T_y != d_y here."""
    p = _problem(length_y=4)  # y: (2, 4, 3)
    weights = (p["x_weight"][:4], p["y_weight"][:4], p["x_bias"][:4].abs(), p["y_bias"][:4].abs())
    attention = bilinear_attention_map(_logits(p))  # (B, G, T_x, T_y)

    def pooled(att):
        return bilinear_attention_pooling(
            p["x"], p["y"], att, weights[0], weights[1], x_bias=weights[2], y_bias=weights[3],
            x_mask=p["x_mask"], y_mask=p["y_mask"],
        )

    dirty = attention.clone()
    dirty[1, :, -1, 0] = 0.9  # x padded, y real
    dirty[1, :, 0, -1] = float("nan")  # x real, y padded
    one = pooled(dirty[:, :1])
    assert one.shape == (2, 1, 4)
    torch.testing.assert_close(one[:, 0], _pooling_by_loops(p, attention[:, 0], weights, 1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pooled(dirty[:, 1]), _pooling_by_loops(p, attention[:, 1], weights, 1), rtol=1e-12, atol=1e-12)


def test_pooling_rejects_bad_pool_and_attention():
    p = _problem()
    attention = bilinear_attention_map(_logits(p))
    weights = (p["x_weight"], p["y_weight"])
    owner = "^bilinear_attention_pooling: "
    for pool in (0, -2, True, 2.0, 4):
        with pytest.raises(ValueError, match=owner + f"pool must be a positive divisor of the rank 6, got {pool}$"):
            bilinear_attention_pooling(p["x"], p["y"], attention, *weights, pool=pool)
    for bad in (attention.tolist(), attention[0, 0], attention[None]):
        with pytest.raises(ValueError, match=owner + r"attention must have shape \(B, T_x, T_y\) or \(B, G, T_x, T_y\)$"):
            bilinear_attention_pooling(p["x"], p["y"], bad, *weights)
    with pytest.raises(ValueError, match=owner + r"y_weight has shape \(6, 2\), but y has feature size 3 \(expected \(rank, 3\)\)$"):
        bilinear_attention_pooling(p["x"], p["y"], attention, p["x_weight"], p["y_weight"][:, :2])


def test_map_errors_name_the_function_and_what_is_wrong():
    p = _problem()
    logits = _logits(p)
    owner = "^bilinear_attention_map: "
    shapes = r"logits must be a float tensor \(B, G, T_x, T_y\), got "
    for bad, got in [(logits[0], r"\(2, 4, 3\)"), (logits.tolist(), "list"), (logits.long(), r"\(2, 2, 4, 3\)")]:
        with pytest.raises(ValueError, match=owner + shapes + got + "$"):
            bilinear_attention_map(bad)
    for value in (float("nan"), float("inf")):
        bad = logits.clone()
        bad[0, 1, 2, 0] = value
        with pytest.raises(ValueError, match=owner + r"logits contain NaN or \+Inf$"):
            bilinear_attention_map(bad)
    with pytest.raises(ValueError, match=owner + r"a glimpse's map has no finite logit \(every pair is -inf\)$"):
        bilinear_attention_map(torch.full_like(logits, float("-inf")))
    one_empty = logits.clone()
    one_empty[0, 1] = float("-inf")  # one glimpse of one sample only
    with pytest.raises(ValueError, match=owner + r"a glimpse's map has no finite logit"):
        bilinear_attention_map(one_empty)
    with pytest.raises(ValueError, match=owner + r"x_mask has shape \(2, 3\), expected \(2, 4\)$"):
        bilinear_attention_map(logits, x_mask=p["x_mask"][:, :3])
    with pytest.raises(ValueError, match=owner + r"y_mask must be a bool tensor"):
        bilinear_attention_map(logits, y_mask=p["y_mask"].int())


def _logits_inputs():
    g = torch.Generator().manual_seed(11)
    return {
        "x": torch.randn(2, 3, 5, generator=g), "y": torch.randn(2, 4, 6, generator=g),
        "x_weight": torch.randn(4, 5, generator=g), "y_weight": torch.randn(4, 6, generator=g),
        "glimpse_weight": torch.randn(2, 4, generator=g),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": [[[1.0]]]}, r"^bilinear_attention_logits: x must be a tensor, got list$"),
        ({"y": torch.ones(2, 4, 6, dtype=torch.long)}, r"^bilinear_attention_logits: y has dtype torch.int64; expected a float tensor$"),
        ({"x": torch.ones(2, 0, 5)}, r"^bilinear_attention_logits: x is an empty sequence \(T_x = 0\)$"),
        ({"y": torch.ones(2, 0, 6)}, r"^bilinear_attention_logits: y is an empty sequence \(T_y = 0\)$"),
        ({"y": torch.ones(2, 6)}, r"^bilinear_attention_logits: y must have shape \(B, T_y, d_y\), got \(2, 6\)$"),
        ({"x_weight": torch.ones(5)}, r"^bilinear_attention_logits: x_weight must have shape \(rank, 5\), got \(5,\)$"),
        ({"y_weight": [[1.0] * 6]}, r"^bilinear_attention_logits: y_weight must have shape \(rank, 6\), got list$"),
        ({"x_weight": torch.full((4, 5), float("nan"))}, r"^bilinear_attention_logits: x_weight contains NaN"),
        ({"x_bias": torch.ones(5)}, r"^bilinear_attention_logits: x_bias must have shape \(4,\), got \(5,\)$"),
        ({"y_bias": [0.0] * 4}, r"^bilinear_attention_logits: y_bias must have shape \(4,\), got list$"),
        ({"y_bias": torch.full((4,), float("inf"))}, r"^bilinear_attention_logits: y_bias contains Inf"),
    ],
)
def test_logits_input_messages_name_the_function_argument_and_shape(change, message):
    inputs = {**_logits_inputs(), **change}
    with pytest.raises(ValueError, match=message):
        bilinear_attention_logits(**inputs)


def test_logits_ignore_nan_at_padded_y_steps():
    # A padded step of y may hold anything, NaN included: the real pairs' logits are those
    # of the same input with zeros there, and the padded pairs are -inf.
    inputs = _logits_inputs()
    y_mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    clean = bilinear_attention_logits(**inputs, y_mask=y_mask)
    inputs["y"] = inputs["y"].clone()
    inputs["y"][0, 3] = float("nan")
    dirty = bilinear_attention_logits(**inputs, y_mask=y_mask)
    assert torch.equal(dirty, clean)
    assert torch.isneginf(dirty[0, :, :, 3]).all() and torch.isfinite(dirty[0, :, :, :3]).all()


def _residual_chain_by_glimpses(x_features, y, attention, y_weight, y_bias, projection_weight, projection_bias, pool):
    """BAN Eq. 11 and 12 as the reference runs them: one glimpse after the other on the
    whole (B, T_y, d_y) stream, f'_g summed over every pair (i, j) by einsum."""
    stream = y
    for g in range(y_weight.shape[0]):
        y_features = torch.relu(stream @ y_weight[g].T + y_bias[g])  # relu(V'_g^T y_j + v'_g)
        joint = torch.einsum("bij,bik,bjk->bk", attention[:, g], x_features[:, :, g], y_features)  # Eq. 12
        joint = joint.unflatten(-1, (-1, pool)).sum(-1)  # sum pooling
        stream = stream + (joint @ projection_weight[g].T + projection_bias[g])[:, None, :]  # Eq. 11
    return stream


@pytest.mark.parametrize("one_product", [True, False])
@pytest.mark.parametrize(("pool", "glimpses"), [(1, 3), (2, 2), (1, 1)])
def test_residual_glimpses_equal_the_glimpse_loop_on_the_whole_stream(pool, glimpses, one_product):
    """The batched chain (a residual r per sample, one product for V'_g^T y_j and for
    A_g^T relu(X^T U'_g) of all glimpses) against the per-glimpse loop it replaces."""
    g = torch.Generator().manual_seed(3)
    batch, length_x, length_y, dim_y, hidden = 3, 4, 5, 6, 2
    rank = hidden * pool
    p = _problem(batch=batch, length_x=length_x, length_y=length_y, dim_y=dim_y, glimpses=glimpses)
    attention = bilinear_attention_map(_logits(p))  # 0 at padded pairs
    x_features = torch.randn(batch, length_x, glimpses, rank, generator=g, dtype=DTYPE).relu()
    y = torch.randn(batch, length_y, dim_y, generator=g, dtype=DTYPE)
    weights = (
        torch.randn(glimpses, rank, dim_y, generator=g, dtype=DTYPE),
        torch.randn(glimpses, rank, generator=g, dtype=DTYPE),
        torch.randn(glimpses, dim_y, hidden, generator=g, dtype=DTYPE),
        torch.randn(glimpses, dim_y, generator=g, dtype=DTYPE),
    )
    residual = bilinear_residual_glimpses(x_features, y, attention, *weights, pool=pool, one_product=one_product)
    expected = _residual_chain_by_glimpses(x_features, y, attention, *weights, pool)
    assert residual.shape == (batch, 1, dim_y)
    torch.testing.assert_close(y + residual, expected, rtol=1e-12, atol=1e-12)
    # every glimpse counts: the chain of the first G - 1 glimpses differs
    if glimpses > 1:
        shorter = bilinear_residual_glimpses(
            x_features[:, :, :-1], y, attention[:, :-1], *(w[:-1] for w in weights), pool=pool,
            one_product=one_product,
        )
        assert not torch.allclose(shorter, residual)


@pytest.mark.parametrize(("length_x", "length_y"), [(4, 3), (3, 4), (3, 3)])
def test_logits_of_features_on_either_side_equal_einsum(length_x, length_y):
    g = torch.Generator().manual_seed(4)
    x_features = torch.randn(2, length_x, 5, generator=g, dtype=DTYPE)
    y_features = torch.randn(2, length_y, 5, generator=g, dtype=DTYPE)
    glimpse_weight = torch.randn(3, 5, generator=g, dtype=DTYPE)
    expected = torch.einsum("gk,bik,bjk->bgij", glimpse_weight, x_features, y_features)  # BAN Eq. 10
    torch.testing.assert_close(bilinear_logits_of_features(x_features, y_features, glimpse_weight), expected)


def test_map_checks_take_one_reduction_and_one_read():
    """The value checks of a well-formed map: one amax, one test of its finiteness and one
    host read (they were two reductions and reads over the whole logits before)."""
    from polyfuse.bench.dispatch import count_operations

    logits = _logits(_problem())
    counter = count_operations(lambda: bilinear_attention_map(logits))
    assert counter.by_name["aten.amax"] == 1 and counter.by_name["aten._local_scalar_dense"] == 1
    assert counter.total == 8  # flatten, amax, mul, eq, all, read, softmax, view
