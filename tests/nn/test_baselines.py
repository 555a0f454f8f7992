"""Tests for the baseline fusion modules: Concat, TFN (Zadeh et al., 2017), LMF (Liu et al., 2018).

Every module is checked against a brute-force computation written here from the
papers' equations, with the module's own weights plugged in: the LSTM by its gate
equations step by step, the Linear layers as ``W x + b`` one sample at a time, TFN's
``[z_l; 1] ⊗ [z_a; 1] ⊗ [z_v; 1]`` by three nested loops and LMF's rank-R sum by
loops over the ranks and modalities. The fusion functions themselves are tested in
tests/functional/test_tensor_fusion.py.
"""

from __future__ import annotations

import pytest
import torch

import polyfuse
from polyfuse.functional import masked_mean
from polyfuse.nn import LMF, TFN, Concat
from polyfuse.nn.modality_subnetworks import (
    PooledSubnetwork,
    SequenceSubnetwork,
    real_steps_first,
)

MODULES = [Concat, TFN, LMF]
SMALL_KWARGS = {
    Concat: {"hidden_dim": 8},
    TFN: {"hidden_dims": 3, "lstm_dim": 4, "post_fusion_dim": 8},
    LMF: {"rank": 3, "hidden_dims": 4, "lstm_dim": 5},
}


def build(cls, input_dims, out_dim=5, **overrides):
    return cls(input_dims, out_dim, **{**SMALL_KWARGS[cls], **overrides})


def random_batch(generator, input_dims, lengths, batch=4, dtype=torch.float32, holes=False):
    """Sequences (B, T_j, d_j) and masks whose real lengths vary per sample (at least 1).

    With ``holes``, sample 1 also has padded steps before and between its real ones."""
    inputs, masks = [], []
    for dim, length in zip(input_dims, lengths, strict=True):
        inputs.append(torch.randn(batch, length, dim, generator=generator, dtype=dtype))
        real = torch.randint(1, length + 1, (batch,), generator=generator)
        real[0] = length  # one sample without padding, one with a single real step
        real[-1] = 1
        mask = torch.arange(length)[None, :] < real[:, None]
        if holes and length >= 3:
            mask[1] = torch.tensor([t % 2 == 1 for t in range(length)])
        masks.append(mask)
    return inputs, masks


# ---------------------------------------------------------------------------
# Brute-force references
# ---------------------------------------------------------------------------


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


def affine(linear, v):
    """One sample through a Linear layer: W v + b, written out."""
    return linear.weight.detach() @ v + linear.bias.detach()


def relu(v):
    return torch.where(v > 0, v, torch.zeros_like(v))


def mlp(linears, v, *, activation=True):
    for linear in linears:
        v = affine(linear, v)
        v = relu(v) if activation else v
    return v


def linears_of(sequential):
    return [m for m in sequential if isinstance(m, torch.nn.Linear)]


def loop_lstm_state(lstm, steps):
    """The LSTM equations (input, forget, cell, output gates; PyTorch's i, f, g, o order)
    over a list of (d,) steps, from zero states: the last hidden state (H,)."""
    w_ih, w_hh = lstm.weight_ih_l0.detach(), lstm.weight_hh_l0.detach()
    b_ih, b_hh = lstm.bias_ih_l0.detach(), lstm.bias_hh_l0.detach()
    size = lstm.hidden_size
    h = torch.zeros(size, dtype=w_ih.dtype)
    c = torch.zeros(size, dtype=w_ih.dtype)
    for x in steps:
        gates = w_ih @ x + b_ih + w_hh @ h + b_hh
        i = torch.sigmoid(gates[:size])
        f = torch.sigmoid(gates[size : 2 * size])
        g = torch.tanh(gates[2 * size : 3 * size])
        o = torch.sigmoid(gates[3 * size :])
        c = f * c + i * g
        h = o * torch.tanh(c)
    return h


def loop_sequence_subnetwork(net, x, mask, *, activation):
    """(B, T, d) -> (B, h): the LSTM over each sample's real steps, then the head."""
    rows = []
    for b in range(x.shape[0]):
        steps = [x[b, t] for t in range(x.shape[1]) if mask[b, t]]
        state = loop_lstm_state(net.lstm, steps or [torch.zeros_like(x[b, 0])])
        rows.append(mlp(linears_of(net.head), state, activation=activation))
    return torch.stack(rows)


def loop_pooled_subnetwork(net, x, mask):
    pooled = loop_masked_mean(x, mask)
    return torch.stack([mlp(linears_of(net.layers), v) for v in pooled])


def loop_outer3(first, second, third):
    """TFN's fusion layer for three modalities, e.g. [z_l; 1] ⊗ [z_a; 1] ⊗ [z_v; 1],
    flattened row-major, one entry at a time."""
    x, y, z = (torch.cat([v, torch.ones(1, dtype=v.dtype)]) for v in (first, second, third))
    out = torch.empty(len(x) * len(y) * len(z), dtype=x.dtype)
    for i in range(len(x)):
        for j in range(len(y)):
            for k in range(len(z)):
                out[(i * len(y) + j) * len(z) + k] = x[i] * y[j] * z[k]
    return out


def loop_low_rank(vectors, factors, rank_weights, bias):
    """LMF's fusion: h = sum_r w_r prod_j ([z_j; 1] W_j^(r)) + b, one output entry at a time."""
    rank, out_dim = rank_weights.shape[0], bias.shape[0]
    out = torch.empty(out_dim, dtype=bias.dtype)
    for o in range(out_dim):
        total = bias[o].clone()
        for r in range(rank):
            product = torch.ones((), dtype=bias.dtype)
            for z, factor in zip(vectors, factors, strict=True):
                augmented = torch.cat([z, torch.ones(1, dtype=z.dtype)])
                product = product * sum(augmented[i] * factor[r, i, o] for i in range(len(augmented)))
            total = total + rank_weights[r] * product
        out[o] = total
    return out


def loop_subnetworks(module, inputs, masks, *, sequence_activation):
    vectors = []
    for net, x, m in zip(module.subnetworks, inputs, masks, strict=True):
        if isinstance(net, SequenceSubnetwork):
            vectors.append(loop_sequence_subnetwork(net, x, m, activation=sequence_activation))
        else:
            vectors.append(loop_pooled_subnetwork(net, x, m))
    return vectors


def loop_tfn(module, inputs, masks):
    """TFN section 3 by hand: subnetworks, the three-way outer product, then the
    inference subnetwork (ReLU layers and a linear output layer)."""
    vectors = loop_subnetworks(module, inputs, masks, sequence_activation=True)
    linears = linears_of(module.post_fusion)
    rows = []
    for b in range(inputs[0].shape[0]):
        fused = loop_outer3(*(z[b] for z in vectors))
        rows.append(affine(linears[-1], mlp(linears[:-1], fused)))
    return torch.stack(rows)


def loop_lmf(module, inputs, masks, *, sequence_activation=False):
    vectors = loop_subnetworks(module, inputs, masks, sequence_activation=sequence_activation)
    factors = [f.detach() for f in module.factors]
    return torch.stack([
        loop_low_rank([z[b] for z in vectors], factors, module.rank_weights.detach(), module.bias.detach())
        for b in range(inputs[0].shape[0])
    ])


def with_nonzero_biases(module):
    """Give every bias a random value, so that a dropped bias is noticed."""
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "bias" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return module


# ---------------------------------------------------------------------------
# Pooling and the subnetworks
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


def test_real_steps_first_keeps_the_order_of_the_real_steps():
    x = torch.arange(10.0).reshape(2, 5, 1)
    mask = torch.tensor([[False, True, False, True, True], [True, True, False, False, False]])
    moved = real_steps_first(x, mask)[..., 0]
    assert moved[0, :3].tolist() == [1.0, 3.0, 4.0]
    assert moved[1, :2].tolist() == [5.0, 6.0]
    # the padded steps follow, in their order too
    assert moved[0, 3:].tolist() == [0.0, 2.0]


@pytest.mark.parametrize("activation", [True, False])
def test_sequence_subnetwork_is_the_lstm_equations_then_the_head(activation):
    torch.manual_seed(0)
    net = with_nonzero_biases(
        SequenceSubnetwork(3, 4, 5, layers=2, activation=activation).double().eval()
    )
    (x,), (mask,) = random_batch(
        torch.Generator().manual_seed(10), [3], [6], batch=5, dtype=torch.float64, holes=True
    )
    mask[2] = False  # no real step: the LSTM reads one zero step
    x = x * mask[..., None]  # FusionModule zeroes padded steps before a subnetwork sees them
    expected = loop_sequence_subnetwork(net, x, mask, activation=activation)
    torch.testing.assert_close(net(x, mask), expected, rtol=0, atol=1e-12)
    assert net.output_dim == 5


def test_pooled_subnetwork_is_the_mean_then_relu_layers():
    torch.manual_seed(0)
    net = with_nonzero_biases(PooledSubnetwork(3, 4, layers=3).double())
    (x,), (mask,) = random_batch(
        torch.Generator().manual_seed(11), [3], [5], dtype=torch.float64, holes=True
    )
    torch.testing.assert_close(net(x, mask), loop_pooled_subnetwork(net, x, mask), rtol=0, atol=1e-12)
    assert len(linears_of(net.layers)) == 3 and net.output_dim == 4
    alone = PooledSubnetwork(3, 4, layers=0)
    assert alone.output_dim == 3
    torch.testing.assert_close(alone(x.float(), mask), loop_masked_mean(x.float(), mask))


def test_subnetwork_dropout_acts_on_the_pooled_vector_and_the_lstm_state():
    """In training mode, the dropout mask falls on the pooled vector (before the first
    layer) and on the LSTM state (before the head): replayed by hand with the same seed."""
    (x,), (mask,) = random_batch(torch.Generator().manual_seed(12), [6], [4], batch=3)
    pooled_net = PooledSubnetwork(6, 5, layers=1, dropout=0.5).train()
    torch.manual_seed(3)
    out = pooled_net(x, mask)
    torch.manual_seed(3)
    dropped = torch.nn.functional.dropout(loop_masked_mean(x, mask), 0.5, training=True)
    torch.testing.assert_close(out, relu(dropped @ pooled_net.layers[0].weight.T + pooled_net.layers[0].bias))
    assert not torch.allclose(out, pooled_net.eval()(x, mask))

    sequence_net = SequenceSubnetwork(6, 5, 2, layers=1, activation=False, dropout=0.5).train()
    torch.manual_seed(4)
    out = sequence_net(x, mask)
    state = sequence_net.last_state(x, mask)
    torch.manual_seed(4)
    dropped = torch.nn.functional.dropout(state, 0.5, training=True)
    head = sequence_net.head[0]
    torch.testing.assert_close(out, dropped @ head.weight.T + head.bias)
    assert not torch.allclose(out, sequence_net.eval()(x, mask))


# ---------------------------------------------------------------------------
# TFN
# ---------------------------------------------------------------------------


def test_tfn_paper_form_has_the_papers_subnetworks():
    """TFN section 3: an LSTM of 128 units and two layers of 128 ReLU units for the
    language; three layers of 32 ReLU units for audio and video; two layers of 128
    ReLU units after the fusion."""
    module = TFN([300, 5, 20], 1)
    language, acoustic, visual = module.subnetworks
    assert isinstance(language, SequenceSubnetwork) and language.lstm.hidden_size == 128
    assert [(m.in_features, m.out_features) for m in linears_of(language.head)] == [(128, 128)] * 2
    assert sum(isinstance(m, torch.nn.ReLU) for m in language.head) == 2
    for net, dim in ((acoustic, 5), (visual, 20)):
        assert isinstance(net, PooledSubnetwork)
        shapes = [(m.in_features, m.out_features) for m in linears_of(net.layers)]
        assert shapes == [(dim, 32), (32, 32), (32, 32)]
    assert module.hidden_dims == [128, 32, 32]
    assert module.fused_size == 129 * 33 * 33
    shapes = [(m.in_features, m.out_features) for m in linears_of(module.post_fusion)]
    assert shapes == [(129 * 33 * 33, 128), (128, 128), (128, 1)]
    assert module.sequence_modalities == [0]


def test_tfn_paper_form_equals_the_equations_by_hand():
    torch.manual_seed(0)
    input_dims = [3, 2, 4]
    module = TFN(input_dims, 2, hidden_dims=[3, 2, 2], lstm_dim=4, post_fusion_dim=5)
    module = with_nonzero_biases(module.double().eval())
    assert module.fused_size == 4 * 3 * 3 and module.subnetworks[0].lstm.hidden_size == 4
    inputs, masks = random_batch(
        torch.Generator().manual_seed(5), input_dims, [4, 3, 5], dtype=torch.float64, holes=True
    )
    expected = loop_tfn(module, [x * m[..., None] for x, m in zip(inputs, masks, strict=True)], masks)
    torch.testing.assert_close(module(inputs, masks), expected, rtol=0, atol=1e-10)


def test_tfn_sequence_modalities_choose_the_lstm_inputs():
    torch.manual_seed(0)
    input_dims = [2, 3, 2]
    module = TFN(input_dims, 2, sequence_modalities=[1, 2], hidden_dims=2, lstm_dim=3,
                 post_fusion_dim=4, post_fusion_layers=1)
    module = with_nonzero_biases(module.double().eval())
    assert [type(net) for net in module.subnetworks] == [
        PooledSubnetwork, SequenceSubnetwork, SequenceSubnetwork
    ]
    assert len(linears_of(module.post_fusion)) == 2
    inputs, masks = random_batch(
        torch.Generator().manual_seed(6), input_dims, [3, 4, 3], dtype=torch.float64, holes=True
    )
    expected = loop_tfn(module, [x * m[..., None] for x, m in zip(inputs, masks, strict=True)], masks)
    torch.testing.assert_close(module(inputs, masks), expected, rtol=0, atol=1e-10)


def test_tfn_light_form_is_one_relu_layer_per_modality_and_one_post_fusion_layer():
    torch.manual_seed(0)
    input_dims = [3, 2, 4]
    module = TFN(input_dims, 2, subnetworks="light")
    assert module.hidden_dims == [16, 16, 16] and module.sequence_modalities == []
    assert all(len(linears_of(net.layers)) == 1 for net in module.subnetworks)
    assert [m.out_features for m in linears_of(module.post_fusion)] == [64, 2]
    module = TFN(input_dims, 2, subnetworks="light", hidden_dims=[3, 2, 2])
    module = with_nonzero_biases(module.double().eval())
    inputs, masks = random_batch(
        torch.Generator().manual_seed(7), input_dims, [4, 2, 3], dtype=torch.float64
    )
    torch.testing.assert_close(module(inputs, masks), loop_tfn(module, inputs, masks), rtol=0, atol=1e-10)


def test_light_form_with_an_lstm_uses_one_relu_layer_after_it():
    torch.manual_seed(0)
    module = TFN([3, 2], 2, subnetworks="light", sequence_modalities=[0])
    language = module.subnetworks[0]
    assert language.lstm.hidden_size == 128 and module.hidden_dims == [16, 16]
    assert [type(m) for m in language.head] == [torch.nn.Linear, torch.nn.ReLU]
    module = LMF([3, 2], 2, subnetworks="light", sequence_modalities=[1], hidden_dims=[3, 2])
    assert [type(m) for m in module.subnetworks[1].head] == [torch.nn.Linear, torch.nn.ReLU]
    assert len(linears_of(module.subnetworks[0].layers)) == 1


def test_tfn_dropout_falls_on_the_fused_tensor():
    torch.manual_seed(0)
    module = TFN([2, 3], 2, subnetworks="light", hidden_dims=2, post_fusion_layers=0, dropout=0.5).train()
    inputs = [torch.randn(4, 2), torch.randn(4, 3)]
    torch.manual_seed(8)
    out = module(inputs)
    vectors = [net(x[:, None], torch.ones(4, 1, dtype=torch.bool))
               for net, x in zip(module.subnetworks, inputs, strict=True)]
    fused = torch.stack([
        torch.outer(torch.cat([a, torch.ones(1)]), torch.cat([b, torch.ones(1)])).flatten()
        for a, b in zip(*vectors, strict=True)
    ])
    torch.manual_seed(8)
    dropped = torch.nn.functional.dropout(fused, 0.5, training=True)
    output_layer = module.post_fusion[-1]
    torch.testing.assert_close(out, dropped @ output_layer.weight.T + output_layer.bias)


def test_tfn_size_error_is_clear_and_limit_can_be_raised():
    with pytest.raises(ValueError) as error:
        TFN([4] * 5, 2, hidden_dims=16)
    message = str(error.value)
    assert "17 * 17 * 17 * 17 * 17 = 1,419,857" in message
    assert "max_fused_size = 1,048,576" in message
    assert "max_fused_size=1419857" in message
    assert "would hold 181,741,696 weights" in message  # times the default post_fusion_dim 128

    with pytest.raises(ValueError, match="4 \\* 4 \\* 4 = 64 entries"):
        TFN([2, 2, 2], 2, hidden_dims=3, max_fused_size=63)
    module = TFN([2, 2, 2], 2, hidden_dims=3, max_fused_size=64)
    assert module.fused_size == 64 and module.max_fused_size == 64


# ---------------------------------------------------------------------------
# LMF
# ---------------------------------------------------------------------------


def test_lmf_paper_form_has_the_papers_subnetworks():
    """LMF: an LSTM and a linear layer for text, 2-layer ReLU networks for audio and video."""
    module = LMF([300, 5, 20], 1)
    text, audio, video = module.subnetworks
    assert isinstance(text, SequenceSubnetwork) and text.lstm.hidden_size == 128
    assert [(m.in_features, m.out_features) for m in text.head] == [(128, 64)]  # no ReLU
    for net, dim in ((audio, 5), (video, 20)):
        shapes = [(m.in_features, m.out_features) for m in linears_of(net.layers)]
        assert shapes == [(dim, 16), (16, 16)]
    assert module.hidden_dims == [64, 16, 16]
    assert [tuple(f.shape) for f in module.factors] == [(4, 65, 1), (4, 17, 1), (4, 17, 1)]


def test_lmf_paper_form_equals_the_rank_sum_by_hand():
    torch.manual_seed(0)
    input_dims = [3, 2, 4]
    module = LMF(input_dims, 3, rank=2, hidden_dims=[3, 2, 2], lstm_dim=4)
    module = with_nonzero_biases(module.double().eval())
    assert module.subnetworks[0].lstm.hidden_size == 4 and module.rank_weights.shape == (2,)
    inputs, masks = random_batch(
        torch.Generator().manual_seed(9), input_dims, [4, 3, 5], dtype=torch.float64, holes=True
    )
    expected = loop_lmf(module, [x * m[..., None] for x, m in zip(inputs, masks, strict=True)], masks)
    torch.testing.assert_close(module(inputs, masks), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("hidden_dims", "sizes"), [(None, [2, 3, 2]), (4, [4, 4, 4])])
def test_lmf_light_form_fuses_the_pooled_vectors(hidden_dims, sizes):
    torch.manual_seed(0)
    input_dims = [2, 3, 2]
    module = with_nonzero_biases(
        LMF(input_dims, 4, rank=3, subnetworks="light", hidden_dims=hidden_dims).double()
    )
    assert module.hidden_dims == sizes and module.sequence_modalities == []
    assert [len(linears_of(net.layers)) for net in module.subnetworks] == [0 if hidden_dims is None else 1] * 3
    inputs, masks = random_batch(
        torch.Generator().manual_seed(10), input_dims, [4, 2, 3], dtype=torch.float64
    )
    torch.testing.assert_close(module(inputs, masks), loop_lmf(module, inputs, masks), rtol=0, atol=1e-10)


def test_lmf_initialisation_is_glorot_normal_per_rank_slice_with_zero_bias():
    """Each rank slice (h_j + 1, O) of a factor ~ N(0, 2 / (h_j + 1 + O)); the fusion
    weights (1, R) ~ N(0, 2 / (1 + R)); the bias is zero. Replayed draw by draw."""
    module = LMF([3, 3], 2, rank=3, subnetworks="light", hidden_dims=[1, 4])
    with torch.no_grad():
        module.bias.fill_(5.0)
    torch.manual_seed(21)
    module.reset_parameters()
    torch.manual_seed(21)
    for factor, h in zip(module.factors, (1, 4), strict=True):
        expected = torch.empty(3, h + 1, 2).normal_(0.0, (2.0 / (h + 1 + 2)) ** 0.5)
        torch.testing.assert_close(factor.detach(), expected, rtol=0, atol=0)
    expected = torch.empty(3).normal_(0.0, (2.0 / (1 + 3)) ** 0.5)
    torch.testing.assert_close(module.rank_weights.detach(), expected, rtol=0, atol=0)
    assert torch.equal(module.bias, torch.zeros(2))


# ---------------------------------------------------------------------------
# The common interface
# ---------------------------------------------------------------------------


def test_concat_is_an_mlp_of_the_pooled_vectors_by_hand():
    torch.manual_seed(0)
    input_dims = [3, 4]
    module = with_nonzero_biases(build(Concat, input_dims).double().eval())
    inputs, masks = random_batch(
        torch.Generator().manual_seed(3), input_dims, [5, 2], dtype=torch.float64
    )
    pooled = torch.cat([loop_masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)], 1)
    first, second = linears_of(module.mlp)
    expected = torch.stack([affine(second, relu(affine(first, v))) for v in pooled])
    torch.testing.assert_close(module(inputs, masks), expected, rtol=0, atol=1e-12)


def test_concat_defaults_and_dropout_after_the_hidden_layer():
    module = Concat([2, 3], 4)
    assert module.hidden_dim == 64 and module.dropout == 0.0
    assert [m.out_features for m in linears_of(module.mlp)] == [64, 4]
    assert Concat([2, 3], 4, hidden_dim=1).hidden_dim == 1
    assert "hidden_dim=64, dropout=0.0" in repr(module)

    torch.manual_seed(0)
    module = Concat([2, 3], 4, hidden_dim=6, dropout=0.5).train()
    inputs = [torch.randn(5, 2), torch.randn(5, 3)]
    torch.manual_seed(1)
    out = module(inputs)
    first, second = linears_of(module.mlp)
    hidden = relu(torch.cat(inputs, 1) @ first.weight.T + first.bias)
    torch.manual_seed(1)
    dropped = torch.nn.functional.dropout(hidden, 0.5, training=True)
    torch.testing.assert_close(out, dropped @ second.weight.T + second.bias)


@pytest.mark.parametrize("cls", MODULES)
def test_padding_changes_nothing_and_matches_unpadded_samples(cls):
    torch.manual_seed(0)
    input_dims, lengths = [3, 4, 2], [5, 3, 4]
    module = build(cls, input_dims).eval()
    generator = torch.Generator().manual_seed(2)
    inputs, masks = random_batch(generator, input_dims, lengths, holes=True)
    out = module(inputs, masks)

    noisy = [
        x + 1e3 * (~m[..., None]) * torch.randn(x.shape, generator=generator)
        for x, m in zip(inputs, masks, strict=True)
    ]
    torch.testing.assert_close(module(noisy, masks), out)

    # each sample alone, cut to its real steps, gives the same row: padding is not
    # merely ignored in the sum but also left out of the count and the recurrence
    for b in range(out.shape[0]):
        alone = [x[b : b + 1, m[b]] for x, m in zip(inputs, masks, strict=True)]
        torch.testing.assert_close(module(alone), out[b : b + 1])
    # and the masks matter: treating padding as real steps changes the answer
    assert not torch.allclose(module(inputs), out)


@pytest.mark.parametrize("cls", MODULES)
def test_two_dimensional_inputs_are_length_one_sequences(cls):
    torch.manual_seed(0)
    input_dims = [3, 4]
    module = build(cls, input_dims).eval()
    inputs = [torch.randn(2, d) for d in input_dims]
    torch.testing.assert_close(module(inputs), module([x[:, None, :] for x in inputs]))


@pytest.mark.parametrize(
    ("cls", "overrides"),
    [
        (Concat, {"dropout": 0.2}),
        (TFN, {"dropout": 0.2, "subnetwork_dropout": 0.1}),
        (LMF, {}),
        (LMF, {"subnetworks": "light", "hidden_dims": None}),
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


def test_registered_names_build_the_paper_forms():
    for name, cls in [("concat", Concat), ("tfn", TFN), ("lmf", LMF)]:
        assert name in polyfuse.nn.available()
        module = polyfuse.nn.create(name, input_dims=[2, 3], out_dim=4)
        assert type(module) is cls
    assert polyfuse.nn.create("tfn", input_dims=[2, 3], out_dim=4).form == "paper"
    assert polyfuse.nn.create("lmf", input_dims=[2, 3], out_dim=4).form == "paper"


def test_repr_names_the_form():
    text = repr(TFN([2, 3], 4, hidden_dims=2, lstm_dim=2))
    assert "subnetworks='paper', sequence_modalities=[0], hidden_dims=[2, 2], fused_size=9, " \
        "post_fusion_dim=128, post_fusion_layers=2, dropout=0.0" in text
    text = repr(LMF([2, 3], 4, subnetworks="light"))
    assert "rank=4, subnetworks='light', sequence_modalities=[], hidden_dims=[2, 3]" in text


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TFN([3], 2), "at least 2 modalities"),
        (lambda: TFN([3, 3, 3], 2, hidden_dims=[2, 2]), "TFN: hidden_dims has 2 entries for 3 modalities"),
        (lambda: LMF([3, 3], 2, rank=0), "LMF: rank must be positive, got 0"),
        (lambda: Concat([3, 3], 2, dropout=1.0), r"Concat: dropout must lie in \[0, 1\), got 1.0"),
        (lambda: Concat([3, 3], 2, hidden_dim=0), "Concat: hidden_dim must be positive, got 0"),
        (lambda: TFN([3, 3], 2, dropout=-0.1), r"TFN: dropout must lie in \[0, 1\)"),
        (lambda: LMF([3, 3], 2, subnetwork_dropout=1.5), r"LMF: subnetwork_dropout must lie in \[0, 1\), got 1.5"),
        (lambda: TFN([3, 3], 2, subnetwork_dropout=1.0), r"TFN: subnetwork_dropout must lie in \[0, 1\), got 1.0"),
        (lambda: LMF([3, 3], 2, hidden_dims=[2, 0]), r"LMF: hidden_dims must be positive, got \[2, 0\]"),
        (lambda: TFN([3, 3], 2, subnetworks="heavy"), "TFN: subnetworks must be one of paper, light, got 'heavy'"),
        (lambda: LMF([3, 3], 2, subnetworks="full"), "LMF: subnetworks must be one of paper, light, got 'full'"),
        (lambda: TFN([3, 3], 2, sequence_modalities=[2]), r"TFN: sequence_modalities must be distinct indices in \[0, 2\), got \[2\]"),
        (lambda: TFN([3, 3], 2, sequence_modalities=[-1]), r"in \[0, 2\), got \[-1\]"),
        (lambda: LMF([3, 3], 2, sequence_modalities=[0, 0]), r"LMF: sequence_modalities must be distinct indices in \[0, 2\), got \[0, 0\]"),
        (lambda: TFN([3, 3], 2, sequence_modalities=["text"]), r"TFN: sequence_modalities must be modality indices, got \['text'\]"),
        (lambda: TFN([3, 3], 2, sequence_modalities=[True]), "must be modality indices"),
        (lambda: TFN([3, 3], 2, lstm_dim=0), "TFN: lstm_dim must be positive, got 0"),
        (lambda: TFN([3, 3], 2, post_fusion_dim=0), "TFN: post_fusion_dim must be positive, got 0"),
        (lambda: TFN([3, 3], 2, post_fusion_layers=-1), "TFN: post_fusion_layers must be >= 0, got -1"),
    ],
)
def test_constructor_validation(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_zero_post_fusion_layers_and_dropout_bounds_are_accepted():
    assert len(linears_of(TFN([2, 2], 3, hidden_dims=2, post_fusion_layers=0).post_fusion)) == 1
    assert TFN([2, 2], 3, hidden_dims=2, dropout=0.0, subnetwork_dropout=0.0).dropout == 0.0
    assert LMF([2, 2], 3, sequence_modalities=[], hidden_dims=2).sequence_modalities == []
    assert LMF([2, 2], 3, rank=1).rank == 1
    assert TFN([2, 2], 3, hidden_dims=1, lstm_dim=1, post_fusion_dim=1).hidden_dims == [1, 1]
    module = TFN([2, 2], 3, hidden_dims=2, subnetwork_dropout=0.3)
    assert [net.dropout.p for net in module.subnetworks] == [0.3, 0.3]
    module = LMF([2, 2], 3, hidden_dims=2, subnetwork_dropout=0.4)
    assert [net.dropout.p for net in module.subnetworks] == [0.4, 0.4]
    assert SequenceSubnetwork(2, 2, 2, layers=1, activation=True).dropout.p == 0.0
    assert PooledSubnetwork(2, 2, layers=1).dropout.p == 0.0


@pytest.mark.parametrize("cls", [TFN, LMF])
def test_the_light_forms_compile_as_one_graph_and_the_paper_forms_around_the_lstm(cls):
    """Without an LSTM nothing runs eagerly: the light forms trace as one graph
    (fullgraph=True, which fails on any break); the paper forms break once, for their
    LSTMs (two graphs). Eager backend: the same capture as inductor, no code generation."""
    from torch._dynamo.testing import CompileCounter

    inputs = [torch.randn(2, 4, d) for d in (5, 3, 4)]
    masks = [torch.tensor([[True] * 4, [True, True, False, False]])] * 3
    for form, graphs in (("light", 1), ("paper", 2)):
        torch.manual_seed(0)
        module = cls([5, 3, 4], 3, subnetworks=form).eval()
        assert polyfuse.nn.traces_as_one_graph(module) is (form == "light")
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = polyfuse.nn.compile(module, backend=counter)
        with torch.no_grad():
            torch.testing.assert_close(compiled(inputs, masks), module(inputs, masks))
        assert counter.frame_count == graphs
    torch._dynamo.reset()
