"""Tests for the baseline fusion modules: Concat, TFN (Zadeh et al., 2017), LMF (Liu et al., 2018).

The reference computations here are written with explicit Python loops over
indices, independent of the einsum code they check.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import polyfuse
from polyfuse.functional import low_rank_fusion, masked_mean, tensor_fusion
from polyfuse.nn import LMF, TFN, Concat

MODULES = [Concat, TFN, LMF]
SMALL_KWARGS = {
    Concat: {"hidden_dim": 8},
    TFN: {"hidden_dims": 3, "post_fusion_dim": 8},
    LMF: {"rank": 3, "hidden_dims": 4},
}


def build(cls, input_dims, out_dim=5, **overrides):
    return cls(input_dims, out_dim, **{**SMALL_KWARGS[cls], **overrides})


def random_batch(generator, input_dims, lengths, batch=4, dtype=torch.float32):
    """Sequences (B, T_j, d_j) and masks whose real lengths vary per sample (at least 1)."""
    inputs, masks = [], []
    for dim, length in zip(input_dims, lengths, strict=True):
        inputs.append(torch.randn(batch, length, dim, generator=generator, dtype=dtype))
        real = torch.randint(1, length + 1, (batch,), generator=generator)
        real[0] = length  # one sample without padding, one with a single real step
        real[-1] = 1
        masks.append(torch.arange(length)[None, :] < real[:, None])
    return inputs, masks


def loop_masked_mean(x, mask):
    """(B, T, d), (B, T) -> (B, d) by explicit loops."""
    batch, length, dim = x.shape
    out = torch.zeros(batch, dim, dtype=x.dtype)
    for b in range(batch):
        count = 0
        for t in range(length):
            if mask[b, t]:
                out[b] += x[b, t]
                count += 1
        out[b] /= count
    return out


def loop_outer(vectors):
    """Row-major flattened outer product of the [z_j, 1], one entry at a time: (B, prod(h_j + 1))."""
    augmented = [torch.cat([v, torch.ones(v.shape[0], 1, dtype=v.dtype)], dim=1) for v in vectors]
    sizes = [a.shape[1] for a in augmented]
    rows = []
    for b in range(vectors[0].shape[0]):
        row = []
        for index in itertools.product(*(range(s) for s in sizes)):
            entry = torch.ones((), dtype=vectors[0].dtype)
            for a, i in zip(augmented, index, strict=True):
                entry = entry * a[b, i]
            row.append(entry)
        rows.append(torch.stack(row))
    return torch.stack(rows)


def full_rank_weight(factors, rank_weights):
    """W = sum_r w_r outer_j W_j^{(r)}, flattened row-major to (prod_j (h_j + 1), O), by loops."""
    sizes = [f.shape[1] for f in factors]
    out_dim = factors[0].shape[2]
    rows = []
    for index in itertools.product(*(range(s) for s in sizes)):
        row = torch.zeros(out_dim, dtype=factors[0].dtype)
        for r in range(rank_weights.shape[0]):
            term = rank_weights[r] * torch.ones(out_dim, dtype=factors[0].dtype)
            for factor, i in zip(factors, index, strict=True):
                term = term * factor[r, i]
            row = row + term
        rows.append(row)
    return torch.stack(rows)


# ---------------------------------------------------------------------------
# Masked mean pooling
# ---------------------------------------------------------------------------


def test_masked_mean_matches_hand_computation():
    x = torch.tensor(
        [
            [[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]],
            [[5.0, 6.0], [-7.0, 8.0], [9.0, 10.0]],
        ]
    )
    mask = torch.tensor([[True, True, False], [True, False, True]])
    expected = torch.tensor([[2.0, 3.0], [7.0, 8.0]])
    torch.testing.assert_close(masked_mean(x, mask), expected)
    generator = torch.Generator().manual_seed(0)
    (x,), (mask,) = random_batch(generator, [3], [6], batch=5)
    torch.testing.assert_close(masked_mean(x, mask), loop_masked_mean(x, mask))


def test_masked_mean_ignores_padded_content_even_nan():
    generator = torch.Generator().manual_seed(1)
    (x,), (mask,) = random_batch(generator, [3], [5])
    changed = x.masked_fill(~mask[..., None], float("nan"))
    torch.testing.assert_close(masked_mean(changed, mask), masked_mean(x, mask))
    assert torch.isfinite(masked_mean(changed, mask)).all()


@pytest.mark.parametrize("cls", MODULES)
def test_padding_changes_nothing_and_matches_unpadded_samples(cls):
    torch.manual_seed(0)
    input_dims, lengths = [3, 4, 2], [5, 3, 4]
    module = build(cls, input_dims).eval()
    generator = torch.Generator().manual_seed(2)
    inputs, masks = random_batch(generator, input_dims, lengths)
    out = module(inputs, masks)

    noisy = [
        x + 1e3 * (~m[..., None]) * torch.randn(x.shape, generator=generator)
        for x, m in zip(inputs, masks, strict=True)
    ]
    torch.testing.assert_close(module(noisy, masks), out)

    # each sample alone, cut to its real steps, gives the same row: padding is not
    # merely ignored in the sum but also left out of the count
    for b in range(out.shape[0]):
        alone = [x[b : b + 1, m[b]] for x, m in zip(inputs, masks, strict=True)]
        torch.testing.assert_close(module(alone), out[b : b + 1])
    # and the masks matter: treating padding as real steps changes the answer
    assert not torch.allclose(module(inputs), out)


def test_concat_is_mlp_of_hand_pooled_vectors():
    torch.manual_seed(0)
    input_dims = [3, 4]
    module = build(Concat, input_dims).eval()
    inputs, masks = random_batch(torch.Generator().manual_seed(3), input_dims, [5, 2])
    pooled = torch.cat([loop_masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)], 1)
    torch.testing.assert_close(module(inputs, masks), module.mlp(pooled))


# ---------------------------------------------------------------------------
# TFN
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(2, 3), (2, 1, 3)])
def test_tensor_fusion_matches_loop_outer_product(sizes):
    generator = torch.Generator().manual_seed(4)
    vectors = [torch.randn(3, h, generator=generator, dtype=torch.float64) for h in sizes]
    fused = tensor_fusion(vectors)
    assert fused.shape == (3, torch.tensor(sizes).add(1).prod().item())
    torch.testing.assert_close(fused, loop_outer(vectors), rtol=0, atol=1e-12)
    # the appended 1s keep the unimodal features: the last entry is 1 and the
    # entries next to it are the last modality's features
    torch.testing.assert_close(fused[:, -1], torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(fused[:, -1 - sizes[-1] : -1], vectors[-1])


def test_tfn_forward_is_post_fusion_of_loop_outer_product():
    torch.manual_seed(0)
    input_dims = [3, 2, 4]
    module = build(TFN, input_dims, hidden_dims=[2, 3, 1]).double().eval()
    assert module.fused_size == 3 * 4 * 2
    inputs, masks = random_batch(
        torch.Generator().manual_seed(5), input_dims, [4, 3, 2], dtype=torch.float64
    )
    vectors = [
        net(loop_masked_mean(x, m))
        for net, x, m in zip(module.subnetworks, inputs, masks, strict=True)
    ]
    expected = module.post_fusion(loop_outer(vectors))
    torch.testing.assert_close(module(inputs, masks), expected, rtol=0, atol=1e-12)


def test_tfn_size_error_is_clear_and_limit_can_be_raised():
    with pytest.raises(ValueError) as error:
        TFN([4] * 5, 2, hidden_dims=16)
    message = str(error.value)
    assert "17 * 17 * 17 * 17 * 17 = 1,419,857" in message
    assert "max_fused_size = 1,048,576" in message
    assert "max_fused_size=1419857" in message

    with pytest.raises(ValueError, match="4 \\* 4 \\* 4 = 64 entries"):
        TFN([2, 2, 2], 2, hidden_dims=3, max_fused_size=63)
    assert TFN([2, 2, 2], 2, hidden_dims=3, max_fused_size=64).fused_size == 64


# ---------------------------------------------------------------------------
# LMF
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(2, 3), (3, 1, 2)])
def test_low_rank_fusion_equals_full_rank_tensor_fusion(sizes):
    """LMF's identity: W · (outer_j [z_j, 1]) + b with W = sum_r w_r outer_j W_j^{(r)}."""
    generator = torch.Generator().manual_seed(6)
    rank, out_dim, batch = 3, 4, 5
    vectors = [torch.randn(batch, h, generator=generator, dtype=torch.float64) for h in sizes]
    factors = [
        torch.randn(rank, h + 1, out_dim, generator=generator, dtype=torch.float64) for h in sizes
    ]
    rank_weights = torch.randn(rank, generator=generator, dtype=torch.float64)
    bias = torch.randn(out_dim, generator=generator, dtype=torch.float64)

    expected = loop_outer(vectors) @ full_rank_weight(factors, rank_weights) + bias
    result = low_rank_fusion(vectors, factors, rank_weights, bias=bias)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-10)


def test_lmf_module_equals_full_rank_tensor_fusion():
    torch.manual_seed(0)
    input_dims = [2, 3, 2]
    module = LMF(input_dims, 4, rank=3).double()
    with torch.no_grad():  # a non-zero bias, so that it is checked too
        module.bias.normal_()
    inputs, masks = random_batch(
        torch.Generator().manual_seed(7), input_dims, [4, 2, 3], dtype=torch.float64
    )
    vectors = [loop_masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)]
    weight = full_rank_weight(list(module.factors), module.rank_weights)
    expected = loop_outer(vectors) @ weight + module.bias
    torch.testing.assert_close(module(inputs, masks), expected.detach(), rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------
# The common interface
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", MODULES)
def test_two_dimensional_inputs_are_length_one_sequences(cls):
    torch.manual_seed(0)
    input_dims = [3, 4]
    module = build(cls, input_dims).eval()
    inputs = [torch.randn(2, d) for d in input_dims]
    out = module(inputs)
    assert out.shape == (2, 5)
    torch.testing.assert_close(out, module([x[:, None, :] for x in inputs]))


@pytest.mark.parametrize("cls", MODULES)
def test_float64(cls):
    torch.manual_seed(0)
    input_dims = [3, 4, 2]
    module = build(cls, input_dims).double()
    inputs, masks = random_batch(
        torch.Generator().manual_seed(8), input_dims, [3, 2, 4], dtype=torch.float64
    )
    out = module(inputs, masks)
    assert out.dtype == torch.float64
    assert out.shape == (4, 5)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("cls", "overrides"),
    [
        (Concat, {"dropout": 0.2}),
        (TFN, {"dropout": 0.2}),
        (LMF, {}),
        (LMF, {"hidden_dims": None}),
    ],
)
def test_gradient_reaches_every_parameter(cls, overrides):
    torch.manual_seed(0)
    input_dims = [3, 4, 2, 2]
    module = build(cls, input_dims, **overrides).train()
    inputs, masks = random_batch(torch.Generator().manual_seed(9), input_dims, [3, 2, 4, 1])
    out = module(inputs, masks)
    (out * torch.randn(out.shape)).sum().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None, name
        assert parameter.grad.abs().sum() > 0, name


def test_registered_names_build_the_classes():
    for name, cls in [("concat", Concat), ("tfn", TFN), ("lmf", LMF)]:
        assert name in polyfuse.nn.available()
        module = polyfuse.nn.create(name, input_dims=[2, 3], out_dim=4)
        assert type(module) is cls
        assert module([torch.randn(2, 2), torch.randn(2, 3)]).shape == (2, 4)


def test_constructor_validation():
    with pytest.raises(ValueError, match="at least 2 modalities"):
        TFN([3], 2)
    with pytest.raises(ValueError, match="hidden_dims has 2 entries for 3 modalities"):
        TFN([3, 3, 3], 2, hidden_dims=[2, 2])
    with pytest.raises(ValueError, match="rank must be positive"):
        LMF([3, 3], 2, rank=0)
    with pytest.raises(ValueError, match="dropout"):
        Concat([3, 3], 2, dropout=1.0)
    with pytest.raises(ValueError, match="hidden_dims must be positive"):
        LMF([3, 3], 2, hidden_dims=[2, 0])
