"""The two backbone settings of MAN appendix H.1 (MulT + extra module, LMF + extra
module), checked against torch.nn.MultiheadAttention, loop oracles written from
MulT's equations and LMF's definition, and invariance to padded or missing rows."""

import math

import pytest
import torch

import polyfuse.nn
from polyfuse.functional.crossmodal import multihead_attention, sinusoidal_positions
from polyfuse.functional.tensor_fusion import low_rank_fusion
from polyfuse.nn import backbones
from polyfuse.nn.backbones import CrossmodalAttention, CrossmodalLayer

DIMS = [6, 5, 4]


def small_man(dims):
    return polyfuse.nn.create("man", input_dims=dims, out_dim=6, hidden_dim=8, heads=2,
                              num_random_features=8, chunks=2, seed=0)


def build(name, extra=small_man):
    torch.manual_seed(0)
    options = {"dim": 6, "heads": 2, "layers": 2} if name == "mult" else {"text_hidden": 7, "text_out": 5, "hidden": 4, "out": 6}
    return backbones.create(name, input_dims=DIMS, extra=extra, **options).eval()


def batch(seed=0, size=4, steps=(5, 4, 6)):
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(size, t, d, generator=generator) for t, d in zip(steps, DIMS, strict=True)]
    lengths = [[5, 3, 1, 4], [4, 2, 4, 1], [6, 6, 3, 2]]
    masks = [torch.arange(t) < torch.tensor(n)[:, None] for t, n in zip(steps, lengths, strict=True)]
    return inputs, masks


def test_sinusoidal_positions_match_the_formula():
    table = sinusoidal_positions(4, 6, dtype=torch.float64)
    for p in range(4):
        for i in range(3):
            w = 10000 ** (-i / 2)
            assert table[p, i].item() == pytest.approx(math.sin((p + 1) * w))
            assert table[p, 3 + i].item() == pytest.approx(math.cos((p + 1) * w))


def test_crossmodal_attention_equals_torch_multihead_attention():
    torch.manual_seed(1)
    ours = CrossmodalAttention(8, 2).eval()
    reference = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([ours.query.weight, ours.key.weight, ours.value.weight]))
        reference.in_proj_bias.copy_(torch.cat([ours.query.bias, ours.key.bias, ours.value.bias]))
        reference.out_proj.weight.copy_(ours.output.weight)
        reference.out_proj.bias.copy_(ours.output.bias)
    target, source = torch.randn(3, 4, 8), torch.randn(3, 6, 8)
    source_mask = torch.arange(6) < torch.tensor([6, 2, 4])[:, None]
    expected, _ = reference(target, source, source, key_padding_mask=~source_mask)
    torch.testing.assert_close(ours(target, source, source_mask), expected, rtol=1e-5, atol=1e-6)


def test_attention_over_a_missing_source_is_zero_and_finite():
    query, key = torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 5, 4)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1] = False
    out = multihead_attention(query, key, key, heads=2, key_mask=mask)
    assert torch.equal(out[1], torch.zeros(3, 4))
    out.sum().backward()
    assert torch.isfinite(query.grad).all()


def test_crossmodal_layer_equals_a_loop_over_steps():
    """MulT's pre-LN layer, written per sample and query step from its equations."""
    torch.manual_seed(2)
    layer = CrossmodalLayer(4, 2).eval()
    target, source = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    source_mask = torch.arange(5) < torch.tensor([5, 2])[:, None]
    got = layer(target, source, source_mask)
    a = layer.attention
    for b in range(2):
        real = source[b, : int(source_mask[b].sum())]
        keys_in = layer.attention_norm(real)
        for t in range(3):
            q_in = layer.attention_norm(target[b, t])
            heads = []
            for h in range(2):
                cols = slice(2 * h, 2 * h + 2)
                q = (a.query.weight @ q_in + a.query.bias)[cols]
                scores = torch.stack([(q * (a.key.weight @ k + a.key.bias)[cols]).sum() / math.sqrt(2) for k in keys_in])
                weights = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
                heads.append(sum(w * (a.value.weight @ k + a.value.bias)[cols] for w, k in zip(weights, keys_in, strict=True)))
            x = target[b, t] + a.output.weight @ torch.cat(heads) + a.output.bias
            hidden = torch.relu(layer.expand.weight @ layer.feedforward_norm(x) + layer.expand.bias)
            expected = x + layer.contract.weight @ hidden + layer.contract.bias
            torch.testing.assert_close(got[b, t], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mult", "lstm_lmf"])
def test_padding_content_and_extra_padding_change_nothing(name):
    model = build(name)
    inputs, masks = batch()
    expected = model(inputs, masks)
    noisy = [torch.where(m.unsqueeze(-1), x, torch.full_like(x, float("nan"))) for x, m in zip(inputs, masks, strict=True)]
    longer = [torch.cat([x, torch.randn(x.shape[0], 3, x.shape[2])], dim=1) for x in noisy]
    longer_masks = [torch.cat([m, torch.zeros(m.shape[0], 3, dtype=torch.bool)], dim=1) for m in masks]
    torch.testing.assert_close(model(longer, longer_masks), expected, rtol=1e-5, atol=1e-6)


def _extra_factory(name):
    def factory(dims):
        cls = polyfuse.nn.get(name)
        if cls.max_modalities is not None and cls.max_modalities < len(dims):
            pytest.skip(f"{name} takes {cls.max_modalities} inputs")
        return polyfuse.nn.create(name, input_dims=dims, out_dim=6)
    return factory


@pytest.mark.parametrize("backbone", ["mult", "lstm_lmf"])
@pytest.mark.parametrize("fusion", polyfuse.nn.available())
def test_a_missing_modality_is_masked_out_whatever_its_rows_hold(backbone, fusion):
    """Sample 1 has no audio (modality 1): its output must not depend on those rows,
    and the other samples' outputs must not either."""
    model = build(backbone, _extra_factory(fusion))
    inputs, masks = batch()
    masks[1] = masks[1].clone()
    masks[1][1] = False
    outputs = []
    for fill in (0.0, 1e3, float("nan")):
        audio = inputs[1].clone()
        audio[1] = fill
        outputs.append(model([inputs[0], audio, inputs[2]], masks))
    assert torch.isfinite(outputs[0]).all()
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs[2], outputs[0], rtol=1e-5, atol=1e-6)
    # and the missing modality really is absent: random rows with an all-True mask differ
    masks[1][1, :2] = True
    audio = inputs[1].clone()
    audio[1] = 5.0
    assert not torch.allclose(model([inputs[0], audio, inputs[2]], masks)[1], outputs[0][1])


def test_mult_representation_does_not_depend_on_the_extra_module():
    alone, with_man = build("mult", extra=None), build("mult")
    alone.load_state_dict({k: v for k, v in with_man.state_dict().items() if not k.startswith("extra.")})
    inputs, masks = batch()
    both = with_man(inputs, masks)
    assert both.shape == (4, with_man.out_dim) and with_man.out_dim == alone.out_dim + 6 == 3 * 2 * 6 + 6
    torch.testing.assert_close(both[:, : alone.out_dim], alone(inputs, masks))
    torch.testing.assert_close(both[:, alone.out_dim :], with_man.extra(*backbones.extra_module_inputs(
        [p(x) * m.unsqueeze(-1) for p, x, m in zip(with_man.projections, inputs, masks, strict=True)], masks)))


def test_lstm_lmf_fuses_the_final_lstm_state_and_pooled_subnetworks():
    model = build("lstm_lmf", extra=None)
    inputs, masks = batch()
    got = model(inputs, masks)
    vectors = [[], [], []]
    for b in range(4):
        n = int(masks[0][b].sum())
        _, (final, _) = model.lstm(inputs[0][b : b + 1, :n])  # the LSTM over the real steps only
        vectors[0].append(model.text_out(final[-1, 0]))
        for j in (1, 2):
            n = int(masks[j][b].sum())
            vectors[j].append(inputs[j][b, :n].mean(dim=0))
    text = torch.stack(vectors[0])
    others = [model.subnetworks[str(j)](torch.stack(vectors[j])) for j in (1, 2)]
    expected = low_rank_fusion([text, *others], list(model.factors), model.rank_weights, bias=model.bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_contextual_mode_reads_the_centre_step():
    model = build("mult", extra=None)
    inputs, masks = batch(steps=(6, 6, 6))
    masks = [torch.ones(4, 6, dtype=torch.bool)] * 3
    centre = torch.tensor([0, 2, 5, 3])
    got = model(inputs, masks, centre)
    # changing a step after the centre changes the output (attention sees the window) ...
    assert got.shape == (4, model.out_dim)
    full = model(inputs, masks)
    assert torch.allclose(got[2], full[2]) and not torch.allclose(got[0], full[0])


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="unknown backbone 'nope'; available: lstm_lmf, mult"):
        backbones.create("nope", input_dims=DIMS)
    model = build("lstm_lmf", extra=None)
    inputs, masks = batch()
    masks[0] = masks[0].flip(1)
    with pytest.raises(ValueError, match="padded at the end"):
        model(inputs, masks)
    with pytest.raises(ValueError, match="modality 2 has shape"):
        model([*inputs[:2], torch.randn(4, 6, 9)], batch()[1])
