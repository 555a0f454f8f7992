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


# Small options of every registered backbone: a backbone registered without an entry
# here fails the tests parametrised over the registry until it is given one.
SMALL_OPTIONS = {
    "mult": {"dim": 6, "heads": 2, "layers": 2},
    "lstm_lmf": {"text_hidden": 7, "text_out": 5, "hidden": 4, "out": 6},
}


def build(name, extra=small_man):
    torch.manual_seed(0)
    return backbones.create(name, input_dims=DIMS, extra=extra, **SMALL_OPTIONS[name]).eval()


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


@pytest.mark.parametrize("name", backbones.available())
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


@pytest.mark.parametrize("backbone", backbones.available())
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


# ---------------------------------------------------------------------------
# Whole-model oracles: the wiring of MulT's encoders and of LMF's subnetworks, written
# from the module docstrings (MulT section 3.2, LMF section 3), with per-sample loops.
# The building blocks they reuse (CrossmodalLayer, nn.LSTM, the subnetworks) are
# checked against loops above.
# ---------------------------------------------------------------------------


def loop_positions(length, dim):
    """MulT's sinusoidal positions 1..length: sines then cosines, w_i = 10000^(-i/(h-1))."""
    half = dim // 2
    table = torch.zeros(length, dim, dtype=torch.float64)
    for p in range(length):
        for i in range(half):
            w = 10000.0 ** (-i / max(half - 1, 1))
            table[p, i], table[p, half + i] = math.sin((p + 1) * w), math.cos((p + 1) * w)
    return table


def loop_layer_norm(norm, x):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def loop_encoder(encoder, target, target_mask, source=None, source_mask=None):
    """sqrt(D) x + positions on real steps, the layers, a final LayerNorm, zero padding."""
    def embed(x, mask):
        return (math.sqrt(encoder.dim) * x + loop_positions(x.shape[1], encoder.dim).to(x.dtype)) * mask[..., None]

    x = embed(target, target_mask)
    keys = None if source is None else embed(source, source_mask)
    for layer in encoder.layers:
        x = layer(x, keys, target_mask if source is None else source_mask)
    return loop_layer_norm(encoder.final_norm, x) * target_mask[..., None]


def test_crossmodal_encoder_embeds_runs_its_layers_and_normalises():
    torch.manual_seed(4)
    encoder = backbones.CrossmodalEncoder(4, 2, 3).double().eval()
    with torch.no_grad():  # a non-trivial final LayerNorm
        encoder.final_norm.weight.uniform_(0.5, 1.5)
        encoder.final_norm.bias.normal_()
    target, source = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)
    target_mask = torch.arange(3) < torch.tensor([3, 2])[:, None]
    source_mask = torch.arange(5) < torch.tensor([4, 2])[:, None]
    torch.testing.assert_close(encoder(target, target_mask, source, source_mask),
                               loop_encoder(encoder, target, target_mask, source, source_mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(encoder(target, target_mask), loop_encoder(encoder, target, target_mask),
                               rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^CrossmodalEncoder: a source needs its mask$"):
        encoder(target, target_mask, source)


def mult_oracle(model, inputs, masks, centre=None):
    """MulT (module docstring, steps 1 to 5) per modality pair, with the extra module's part."""
    count = len(inputs)
    projected = [(x @ p.weight.T) * m[..., None] for p, x, m in zip(model.projections, inputs, masks, strict=True)]
    pooled = []
    for alpha in range(count):
        crossed = [loop_encoder(model.crossmodal[alpha][k], projected[alpha], masks[alpha], projected[beta], masks[beta])
                   for k, beta in enumerate(b for b in range(count) if b != alpha)]  # CM_{beta -> alpha}
        memory = loop_encoder(model.memories[alpha], torch.cat(crossed, -1), masks[alpha])
        rows = []
        for b in range(memory.shape[0]):
            real = int(masks[alpha][b].sum())
            if centre is not None:
                rows.append(memory[b, int(centre[b])])
            else:
                rows.append(memory[b, real - 1] if real else torch.zeros_like(memory[b, 0]))  # the last real step
        pooled.append(torch.stack(rows))
    last = torch.cat(pooled, -1)
    hidden = torch.relu(last @ model.project_in.weight.T + model.project_in.bias) @ model.project_out.weight.T
    parts = [last + hidden + model.project_out.bias]
    if model.extra is not None:
        parts.append(model.extra(*backbones.extra_module_inputs(projected, masks)))
    return torch.cat(parts, -1)


@pytest.mark.parametrize("extra", [None, small_man])
def test_mult_is_crossmodal_encoders_memories_last_step_and_residual_projection(extra):
    model = build("mult", extra=extra).double()
    assert len(model.memories[0].layers) == 3 and len(model.crossmodal[0][0].layers) == 2  # max(layers, 3)
    inputs, masks = batch()
    inputs = [x.double() for x in inputs]
    masks[1] = masks[1].clone()
    masks[1][3] = False  # sample 3 misses modality 1: its pooled vector is zero
    with torch.no_grad():
        expected = mult_oracle(model, inputs, masks)
        torch.testing.assert_close(model(inputs, masks), expected, rtol=0, atol=1e-10)
        window = [torch.ones(4, 6, dtype=torch.bool)] * 3
        inputs = [torch.randn(4, 6, d, dtype=torch.float64) for d in DIMS]
        centre = torch.tensor([0, 2, 5, 3])
        torch.testing.assert_close(model(inputs, window, centre), mult_oracle(model, inputs, window, centre),
                                   rtol=0, atol=1e-10)
    assert model.out_dim == 3 * 2 * 6 + (6 if extra else 0) and model.mult_dim == 36


class RecordingExtra(torch.nn.Module):
    """An extra module that keeps what it was given and returns sum_t x_j per modality."""

    def __init__(self, dims):
        super().__init__()
        self.dims, self.out_dim, self.seen = list(dims), sum(dims), None

    def forward(self, inputs, masks):
        self.seen = ([x.detach().clone() for x in inputs], [m.clone() for m in masks])
        return torch.cat([x.sum(1) for x in inputs], -1)


def test_lstm_lmf_gives_the_extra_module_the_encoded_sequences():
    torch.manual_seed(5)
    model = backbones.create("lstm_lmf", input_dims=DIMS, extra=RecordingExtra, text_hidden=7, text_out=5,
                             hidden=[99, 4, 3], out=6).double().eval()
    assert model.extra.dims == [7, 4, 3] and model.out_dim == 6 + 14 and model.vector_dims == [5, 4, 3]
    inputs, masks = batch()
    inputs = [x.double() for x in inputs]
    masks[2] = masks[2].clone()
    masks[2][1] = False  # sample 1 misses modality 2
    with torch.no_grad():
        got = model(inputs, masks)
        seen_inputs, seen_masks = model.extra.seen
        for b in range(4):
            n = int(masks[0][b].sum())
            steps, _ = model.lstm(inputs[0][b : b + 1, :n])  # LSTM outputs over the real steps only
            torch.testing.assert_close(seen_inputs[0][b, :n], steps[0], rtol=0, atol=1e-12)
            assert bool((seen_inputs[0][b, n:] == 0).all())
            for j in (1, 2):
                layer = model.step_encoders[str(j)][0]
                real = masks[j][b]
                if real.any():
                    expected = torch.relu(inputs[j][b] @ layer.weight.T + layer.bias) * real[:, None]
                    torch.testing.assert_close(seen_inputs[j][b], expected, rtol=0, atol=1e-12)
                    assert torch.equal(seen_masks[j][b], real)
                else:  # a missing modality: one real step of zeros
                    assert bool((seen_inputs[j][b] == 0).all())
                    assert seen_masks[j][b].tolist() == [True] + [False] * (real.numel() - 1)
        torch.testing.assert_close(got[:, 6:], torch.cat([x.sum(1) for x in seen_inputs], -1), rtol=0, atol=0)
        alone = backbones.create("lstm_lmf", input_dims=DIMS, text_hidden=7, text_out=5, hidden=[99, 4, 3],
                                 out=6).double().eval()
        alone.load_state_dict(model.state_dict())
        torch.testing.assert_close(got[:, :6], alone(inputs, masks), rtol=0, atol=0)


def test_lstm_lmf_contextual_mode_reads_the_centre_step():
    model = build("lstm_lmf", extra=None).double()
    inputs = [torch.randn(3, 5, d, dtype=torch.float64) for d in DIMS]
    masks = [torch.ones(3, 5, dtype=torch.bool)] * 3
    centre = torch.tensor([0, 3, 4])
    with torch.no_grad():
        got = model(inputs, masks, centre)
        steps, _ = model.lstm(inputs[0])  # every step real: the LSTM's output at the centre
        text = model.text_out(steps[torch.arange(3), centre])
        others = [model.subnetworks[str(j)](inputs[j][torch.arange(3), centre]) for j in (1, 2)]
        expected = low_rank_fusion([text, *others], list(model.factors), model.rank_weights, bias=model.bias)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_lstm_lmf_subnetworks_and_initialisation_follow_lmf():
    torch.manual_seed(6)
    model = backbones.create("lstm_lmf", input_dims=[3, 40, 30], text=1, text_hidden=5, text_out=60, hidden=50,
                             out=70, rank=400, dropout=0.3)
    assert model.text == 1 and model.lstm.input_size == 40 and sorted(model.subnetworks) == ["0", "2"]
    network = model.subnetworks["0"]
    assert [type(layer).__name__ for layer in network] == [
        "BatchNorm1d", "Dropout", "Linear", "ReLU", "Linear", "ReLU", "Linear", "ReLU"]
    assert network[1].p == 0.3 and model.text_dropout.p == 0.3
    assert [(layer.in_features, layer.out_features) for layer in network if isinstance(layer, torch.nn.Linear)] == [
        (3, 50), (50, 50), (50, 50)]
    assert model.vector_dims == [50, 60, 50] and model.rank == 400 and model.fusion_dim == 70
    # LMF's code: Xavier-normal factors (std sqrt(2 / (fan_in + fan_out))), zero bias
    for h, factor in zip(model.vector_dims, model.factors, strict=True):
        assert factor.shape == (400, h + 1, 70)
        assert float(factor.detach().std()) == pytest.approx(math.sqrt(2.0 / (h + 1 + 70)), rel=0.02)
    assert float(model.rank_weights.detach().std()) == pytest.approx(math.sqrt(2.0 / 401), rel=0.1)
    assert bool((model.bias == 0).all()) and model.bias.shape == (70,)


def test_backbone_construction_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^LSTMLMF needs at least 2 modalities, got input_dims=\[4\]$"):
        backbones.create("lstm_lmf", input_dims=[4])
    with pytest.raises(ValueError, match=r"^LSTMLMF: text=3 is not a modality index \(0..2\)$"):
        backbones.create("lstm_lmf", input_dims=DIMS, text=3)
    with pytest.raises(ValueError, match=r"^LSTMLMF: text=-1 is not"):
        backbones.create("lstm_lmf", input_dims=DIMS, text=-1)
    for bad in ({"hidden": [4, 4]}, {"hidden": 0}, {"hidden": [4, 0, 4]}, {"text_hidden": 0}, {"text_out": 0},
                {"out": 0}, {"rank": 0}):
        with pytest.raises(ValueError, match=r"^LSTMLMF: sizes must be positive \(hidden="):
            backbones.create("lstm_lmf", input_dims=DIMS, **bad)
    with pytest.raises(ValueError, match=r"^MulT needs at least 2 modalities, got input_dims=\[4\]$"):
        backbones.create("mult", input_dims=[4])
    with pytest.raises(ValueError, match=r"^CrossmodalAttention: dim=6 is not divisible by heads=4$"):
        CrossmodalAttention(6, 4)
    with pytest.raises(ValueError, match=r"^CrossmodalEncoder: layers must be >= 1, got 0$"):
        backbones.CrossmodalEncoder(4, 2, 0)
    assert backbones.available() == ["lstm_lmf", "mult"]
    assert backbones.get("MulT") is backbones.MulT and backbones.MulT.registry_name == "mult"


def test_backbone_input_errors_name_the_modality():
    model = build("mult", extra=None)
    inputs, masks = batch()
    cases = [
        (inputs[:2], masks, r"^MulT: expected a list of 3 modality tensors$"),
        (inputs[0], masks, r"^MulT: expected a list of 3 modality tensors$"),
        (inputs, masks[:2], r"^MulT: expected one mask per modality$"),
        (inputs, masks[0], r"^MulT: expected one mask per modality$"),
        ([inputs[0], inputs[1][..., :3], inputs[2]], masks,
         r"^MulT: modality 1 has shape \(4, 4, 3\) torch.float32; expected float \(B, T, 5\)$"),
        ([inputs[0], inputs[1][0], inputs[2]], masks, r"^MulT: modality 1 has shape \(4, 5\)"),
        ([inputs[0], inputs[1].long(), inputs[2]], masks, r"^MulT: modality 1 has shape \(4, 4, 5\) torch.int64"),
        ([inputs[0], inputs[1][:2], inputs[2]], masks, r"^MulT: modality 1 has batch size 2, modality 0 has 4$"),
        (inputs, [masks[0], masks[1].float(), masks[2]],
         r"^MulT: mask 1 must be bool of shape \(4, 4\), got torch.float32 \(4, 4\)$"),
        (inputs, [masks[0], masks[1][:, :3], masks[2]], r"^MulT: mask 1 must be bool of shape \(4, 4\), got torch.bool \(4, 3\)$"),
    ]
    for bad_inputs, bad_masks, message in cases:
        with pytest.raises(ValueError, match=message):
            model(bad_inputs, bad_masks)
    torch.testing.assert_close(model(inputs), model(inputs, [torch.ones(x.shape[:2], dtype=torch.bool) for x in inputs]))
    with pytest.raises(ValueError, match=r"^unknown pooling 'max'; expected last or mean$"):
        backbones.pool_steps(inputs[0], masks[0], None, "max")


def test_pool_steps_and_extra_inputs_by_hand():
    x = torch.arange(2 * 4 * 2, dtype=torch.float64).view(2, 4, 2) + 1
    mask = torch.tensor([[True, True, True, False], [False, False, False, False]])
    assert backbones.pool_steps(x, mask, None, "last").tolist() == [[5.0, 6.0], [0.0, 0.0]]
    assert backbones.pool_steps(x, mask, None, "mean").tolist() == [[3.0, 4.0], [0.0, 0.0]]
    assert backbones.pool_steps(x, mask, torch.tensor([1, 2]), "mean").tolist() == [[3.0, 4.0], [0.0, 0.0]]
    gaps = torch.tensor([[True, False, True, False], [False, True, False, False]])  # last real step: 2, 1
    assert backbones.pool_steps(x, gaps, None, "last").tolist() == [[5.0, 6.0], [11.0, 12.0]]
    cleaned, masks = backbones.check_backbone_inputs([x.masked_fill(~mask[..., None], float("nan"))], [mask], [2], "T")
    assert cleaned[0].tolist() == (x * mask[..., None]).tolist() and masks[0] is mask
    new_inputs, new_masks = backbones.extra_module_inputs([x, x], [mask, gaps])
    assert new_masks[0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert new_inputs[0].tolist() == [(x[0] * mask[0, :, None]).tolist(), [[0.0, 0.0]] * 4]  # padding zeroed
    # nothing missing: the same mask, the padded steps zeroed (no host read decides to skip it)
    assert new_masks[1].tolist() == gaps.tolist()
    assert new_inputs[1].tolist() == (x * gaps[..., None]).tolist()


def test_crossmodal_blocks_pass_their_dropout_rates_down():
    from polyfuse.nn.backbones.transformer import CrossmodalEncoder

    assert CrossmodalAttention(4, 2).dropout == 0.0  # MulT's defaults: 0 / 0.1 / 0.1 / 0.1 / 0.25
    default_layer = CrossmodalLayer(4, 2)
    assert (default_layer.attention.dropout, default_layer.relu_dropout, default_layer.residual_dropout) == (0.1, 0.1, 0.1)
    default = CrossmodalEncoder(4, 2, 1)  # one layer is enough
    assert len(default.layers) == 1 and default.embed_dropout == 0.25
    assert (default.layers[0].attention.dropout, default.layers[0].relu_dropout) == (0.1, 0.1)
    encoder = CrossmodalEncoder(4, 2, 2, attention_dropout=0.2, relu_dropout=0.3, residual_dropout=0.4, embed_dropout=0.5)
    for layer in encoder.layers:
        assert (layer.attention.dropout, layer.relu_dropout, layer.residual_dropout) == (0.2, 0.3, 0.4)


def test_crossmodal_blocks_at_rate_zero_train_as_they_evaluate_and_drop_otherwise():
    from polyfuse.nn.backbones.transformer import CrossmodalEncoder

    torch.manual_seed(0)
    target, source = torch.randn(2, 5, 4), torch.randn(2, 3, 4)
    target_mask, source_mask = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)
    quiet = CrossmodalEncoder(4, 2, 2, attention_dropout=0.0, relu_dropout=0.0, residual_dropout=0.0, embed_dropout=0.0)
    evaluated = quiet.eval()(target, target_mask, source, source_mask)
    torch.testing.assert_close(quiet.train()(target, target_mask, source, source_mask), evaluated)
    attention = CrossmodalAttention(4, 2, dropout=0.5)
    evaluated = attention.eval()(target, source, source_mask)
    torch.manual_seed(1)
    assert not torch.allclose(attention.train()(target, source, source_mask), evaluated)


def test_mult_defaults_and_dropout_rates_as_built():
    from polyfuse.nn.backbones.mult import MulT

    default = MulT([3, 4])  # two modalities are enough
    assert default.dim == 30 and default.modality_names == ["m0", "m1"] and default.output_dropout == 0.0
    encoder = default.crossmodal[0][0]
    assert len(encoder.layers) == 5 and encoder.layers[0].attention.heads == 5
    assert encoder.layers[0].attention.dropout == 0.1 and len(default.memories[0].layers) == 5
    rates = {"attention_dropout": 0.2, "relu_dropout": 0.3, "residual_dropout": 0.4, "embed_dropout": 0.5}
    custom = MulT([3, 4], dim=4, heads=2, layers=1, **rates)
    for encoder in (custom.crossmodal[1][0], custom.memories[1]):
        layer = encoder.layers[0]
        assert (layer.attention.dropout, layer.relu_dropout, layer.residual_dropout, encoder.embed_dropout) == (0.2, 0.3, 0.4, 0.5)


def test_mult_dropout_only_in_training_and_only_at_its_rates():
    from polyfuse.nn.backbones.mult import MulT

    torch.manual_seed(0)
    inputs = [torch.randn(2, 4, 3), torch.randn(2, 5, 4)]
    zero = {"attention_dropout": 0.0, "relu_dropout": 0.0, "residual_dropout": 0.0, "embed_dropout": 0.0}
    quiet = MulT([3, 4], dim=4, heads=2, layers=1, output_dropout=0.0, **zero)
    torch.testing.assert_close(quiet.train()(inputs), quiet.eval()(inputs))  # rate 0: no dropout
    noisy = MulT([3, 4], dim=4, heads=2, layers=1, output_dropout=0.5, **zero).eval()
    torch.manual_seed(1)
    first = noisy(inputs)
    torch.manual_seed(2)
    torch.testing.assert_close(noisy(inputs), first)  # eval: the output dropout is off


def _lstm_lmf(**options):
    from polyfuse.nn.backbones.lstm_lmf import LSTMLMF

    return LSTMLMF([3, 4], **options)


def test_lstm_lmf_defaults_smallest_sizes_and_out_dim():
    default = _lstm_lmf()  # two modalities are enough
    assert (default.lstm.hidden_size, default.text_out.out_features, default.vector_dims) == (64, 32, [32, 16])
    assert (default.fusion_dim, default.rank, default.out_dim) == (32, 4, 32)  # no extra module: LMF's size
    tiny = _lstm_lmf(text_hidden=1, text_out=1, hidden=1, out=1, rank=1)
    assert tiny.out_dim == 1 and tiny.vector_dims == [1, 1]


def test_lstm_lmf_initial_factor_scales():
    # LMF's factors ~ N(0, 2 / (h + 1 + out)) and rank weights ~ N(0, 2 / (1 + rank)) (Xavier normal).
    torch.manual_seed(0)
    factors = _lstm_lmf(text_out=1, hidden=1, out=1, rank=2000).factors[0].detach()  # (2000, 2, 1)
    assert factors.std().item() == pytest.approx(math.sqrt(2 / 3), rel=0.05)
    weights = torch.cat([_lstm_lmf(text_hidden=1, text_out=1, hidden=1, out=1, rank=3).rank_weights.detach() for _ in range(300)])
    assert weights.std().item() == pytest.approx(math.sqrt(2 / 4), rel=0.08)


def test_lstm_lmf_fusion_bias_messages_and_padding():
    torch.manual_seed(1)
    extra = lambda dims: polyfuse.nn.create("concat", input_dims=dims, out_dim=3)  # noqa: E731
    model = _lstm_lmf(text_hidden=4, text_out=3, hidden=2, out=5, rank=2, extra=extra).eval()
    inputs = [torch.randn(2, 4, 3), torch.randn(2, 3, 4)]
    masks = [torch.tensor([[True, True, False, False], [True, True, True, True]]), torch.tensor([[True, True, False], [True] * 3])]
    before = model(inputs, masks)
    with torch.no_grad():
        model.bias.fill_(1.0)  # LMF Eq. 6's bias reaches the output
    torch.testing.assert_close(model(inputs, masks)[:, :5], before[:, :5] + 1.0)
    model(inputs, masks).sum().backward()  # padded steps pass no NaN back
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    missing = [inputs[0].clone(), inputs[1]]
    missing_masks = [masks[0].clone(), masks[1]]
    missing_masks[0][0] = False  # sample 0 has no text: its text state is zeros, whatever the rows hold
    first = model(missing, missing_masks)
    missing[0][0] = 7.0
    torch.testing.assert_close(model(missing, missing_masks), first)
    with torch.no_grad():
        model.lstm.bias_ih_l0.add_(1.0)  # nor on what the LSTM would make of a padded step
    torch.testing.assert_close(model(missing, missing_masks)[0], first[0])
    with pytest.raises(ValueError, match=r"^LSTMLMF: the text modality \(m0\) must be padded at the end \(real steps "
                                         r"first\); read left-padded files with data.padding: left$"):
        model(inputs, [masks[0].flip(1), masks[1]])
    with pytest.raises(ValueError, match=r"^LSTMLMF: "):
        model([inputs[0].long(), inputs[1]], masks)


def test_lstm_lmf_padded_steps_pass_no_nan_back_to_the_step_encoders():
    """Padded steps of a non-text modality are zeroed, not divided away: with every ReLU of the
    step encoder active (a large bias), a padded step would otherwise send 0 / 0 = NaN back."""
    torch.manual_seed(2)
    extra = lambda dims: polyfuse.nn.create("concat", input_dims=dims, out_dim=3)  # noqa: E731
    model = _lstm_lmf(text_hidden=4, text_out=3, hidden=4, out=5, rank=2, extra=extra).eval()
    with torch.no_grad():
        model.step_encoders["1"][0].bias.fill_(5.0)
    inputs = [torch.randn(2, 4, 3), torch.randn(2, 3, 4)]
    masks = [torch.tensor([[True, True, False, False], [True] * 4]), torch.tensor([[True, False, False], [True] * 3])]
    model(inputs, masks).sum().backward()
    encoder = model.step_encoders["1"][0]
    assert torch.isfinite(encoder.weight.grad).all() and torch.isfinite(encoder.bias.grad).all()
    assert encoder.weight.grad.abs().sum() > 0


def test_lstm_lmf_centre_on_a_padded_text_step_reads_a_zero_state():
    """Contextual mode where the sample's own utterance has no text (a padded centre step):
    the text state is the zero LSTM output there, whatever the padded rows hold."""
    torch.manual_seed(1)
    model = _lstm_lmf(text_hidden=4, text_out=3, hidden=2, out=5, rank=2).eval()
    inputs = [torch.randn(2, 4, 3), torch.randn(2, 4, 4)]
    masks = [torch.tensor([[True, True, False, False], [True] * 4]), torch.ones(2, 4, dtype=torch.bool)]
    centre = torch.tensor([3, 1])
    first = model(inputs, masks, centre=centre)
    assert torch.isfinite(first).all()
    inputs[0][0, 2:] = 9.0
    torch.testing.assert_close(model(inputs, masks, centre=centre), first)
    with torch.no_grad():  # the text vector of sample 0 is text_out(0) = its bias: zeroing the LSTM changes nothing
        for parameter in model.lstm.parameters():
            parameter.zero_()
    torch.testing.assert_close(model(inputs, masks, centre=centre)[0], first[0])
