"""The MAN module: symmetry, random-feature handling, stacking, and agreement of its
modes with each other and with the functional core."""

import itertools
import math

import pytest
import torch

import polyfuse
from polyfuse.nn import MAN
from polyfuse.nn.man import MultiLinearAttentionLayer

DOUBLE = torch.float64
DIMS = [6, 5, 7]
LENGTHS = [4, 3, 5]


def inputs_and_masks(seed=0, batch=3):
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, t, d, generator=generator, dtype=DOUBLE) for t, d in zip(LENGTHS, DIMS, strict=True)]
    masks = [torch.ones(batch, t, dtype=torch.bool) for t in LENGTHS]
    masks[0][1, 2:] = False
    masks[2][2, :3] = False
    return inputs, masks


def make(**kwargs):
    torch.manual_seed(0)
    return MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16, **kwargs).double().eval()


def permuted_copy(module, order, **kwargs):
    """The same MAN with its modalities (and their parameters) in another order."""
    other = MAN([DIMS[i] for i in order], 8, hidden_dim=12, heads=3, num_random_features=16, **kwargs)
    other = other.double().eval()
    state = module.state_dict()
    new_state = {}
    for key, value in state.items():
        parts = key.split(".")
        for position, part in enumerate(parts[:-1]):
            if part in ("projections", "input_projections"):
                parts[position + 1] = str(order.index(int(parts[position + 1])))
        new_state[".".join(parts)] = value
    other.load_state_dict(new_state)
    return other


@pytest.mark.parametrize("mode", ["had", "exact", "hadamard"])
@pytest.mark.parametrize("layers", [1, 2])
def test_permuting_modalities_with_their_parameters_changes_nothing(mode, layers):
    module = make(mode=mode, layers=layers)
    inputs, masks = inputs_and_masks()
    order = [2, 0, 1]
    other = permuted_copy(module, order, mode=mode, layers=layers)
    permuted = other([inputs[i] for i in order], [masks[i] for i in order])
    torch.testing.assert_close(permuted, module(inputs, masks), rtol=1e-10, atol=1e-12)


def test_had_approaches_exact_with_many_random_features():
    exact = make(mode="exact")
    inputs, masks = inputs_and_masks()
    reference = exact(inputs, masks)
    errors = []
    for num_features in (16, 4096):
        had = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=num_features, mode="had").double().eval()
        state = {k: v for k, v in exact.state_dict().items() if "random_matrix" not in k}
        had.load_state_dict(state, strict=False)
        errors.append((had(inputs, masks) - reference).pow(2).mean().item())
    assert errors[1] < errors[0] / 5
    assert errors[1] < 0.01 * reference.pow(2).mean().item()


def test_single_layer_had_module_equals_the_random_feature_estimate_by_loops():
    """A non-residual MAN (inputs of unequal sizes) in had mode against Eq. 10 to 12 by a
    loop over tuples of real steps with the module's own random features: exact, since the
    estimate is a fixed function once the features are drawn."""
    module = make(mode="had", estimator="arf", chunks=4, lsc_scale=0.3, temperature=0.5, exact_lsc=False)
    inputs, masks = inputs_and_masks()
    with torch.no_grad():
        pooled, _ = man_pass_by_brute_force(
            module.layers[0], inputs, masks, temperature=0.5, chunks=4, scale=0.3, had=True
        )
        expected = module.output(pooled)
    torch.testing.assert_close(module(inputs, masks), expected)


def test_random_features_change_only_through_redraw():
    module = make(mode="had", redraw_in_training=False)
    inputs, masks = inputs_and_masks()
    before = module.layers[0].random_matrix.clone()
    first = module(inputs, masks)
    module.train()
    module(inputs, masks)
    module.eval()
    torch.testing.assert_close(module(inputs, masks), first, rtol=0, atol=0)  # eval is deterministic
    assert torch.equal(module.layers[0].random_matrix, before)
    module.redraw_random_features()
    assert not torch.equal(module.layers[0].random_matrix, before)
    assert not torch.allclose(module(inputs, masks), first)
    # Same seed, same features; and the features travel with the state dict.
    assert torch.equal(make().layers[0].random_matrix, before)
    restored = make(seed=7, mode="had", redraw_in_training=False)
    restored.load_state_dict(module.state_dict())
    torch.testing.assert_close(restored(inputs, masks), module(inputs, masks), rtol=0, atol=0)


def test_random_features_are_orthogonal_by_default_and_shared_by_modalities():
    module = make()
    features = module.layers[0].random_matrix  # (G, H, K' + C)
    assert features.shape == (3, 16, 4 + 4)
    block = features[0, :8]
    gram = block @ block.T
    assert (gram - torch.diag(torch.diagonal(gram))).abs().max() < 1e-5  # drawn in float32
    iid = make(orthogonal=False).layers[0].random_matrix[0, :8]
    gram = iid @ iid.T
    assert (gram - torch.diag(torch.diagonal(gram))).abs().max() > 1e-3


def lsc_vector_by_hand(mask_row, step, chunks, scale):
    """Note 3 of the papers' README: chunk c = floor(rank * C / length) of the step's rank
    among the real steps; entries +e at positions i <= c, -e elsewhere."""
    real_steps = torch.nonzero(mask_row).flatten().tolist()
    chunk = real_steps.index(step) * chunks // len(real_steps)
    return torch.tensor([scale if i <= chunk else -scale for i in range(chunks)], dtype=DOUBLE)


def man_pass_by_brute_force(layer, sequences, masks, *, temperature, chunks, scale, had=False):
    """One multi-head MAN pass (Eq. 5, 7, 8, 13's MAN(.)) by a loop over every tuple of real
    steps: weights softmax_t(tau sum_{j<k} <a_j, a_k>) (exact), or with ``had`` the positive
    random-feature estimate of the same kernel, (1/H) sum_h prod_j exp(w_h.a_j' - |a_j'|^2/2)
    with a' = sqrt(tau) a and w_h the head's random features (Eq. 10 to 12, normalised over
    the tuples); f'_k = sum_t A_t prod_j v_j[t_j, k], f = P^T f' per head, heads
    concatenated. sequences: (B, T_j, D). Returns (B, G K) and the weights of each
    (sample, head) as {steps tuple: weight}."""
    heads, head_dim = layer.heads, layer.head_dim
    batch = sequences[0].shape[0]
    output = torch.zeros(batch, heads * head_dim, dtype=DOUBLE)
    attention = {}
    for b in range(batch):
        real = [torch.nonzero(mask[b]).flatten().tolist() for mask in masks]
        # U'_j (the first hidden_dim rows of the joint map) and U''_j (the rest)
        values = [project(x[b])[:, : heads * head_dim] for project, x in zip(layer.projections, sequences, strict=True)]
        features = [project(x[b])[:, heads * head_dim :] for project, x in zip(layer.projections, sequences, strict=True)]
        for g in range(heads):
            k_slice = slice(g * head_dim, (g + 1) * head_dim)
            a_slice = slice(g * layer.attention_dim, (g + 1) * layer.attention_dim)
            tuples = list(itertools.product(*real))
            kernels = []
            for steps in tuples:
                a = [
                    torch.cat([features[j][t, a_slice], lsc_vector_by_hand(masks[j][b], t, chunks, scale)])
                    for j, t in enumerate(steps)
                ]
                if had:
                    w = layer.random_matrix[g].to(DOUBLE)  # (H, K' + C)
                    a = [math.sqrt(temperature) * vector for vector in a]
                    kernels.append(math.prod(torch.exp(w @ v - v @ v / 2) for v in a).mean())
                else:
                    logit = sum(a[j] @ a[k] for j in range(len(a)) for k in range(j + 1, len(a)))
                    kernels.append(torch.exp(temperature * logit))
            weights = torch.stack(kernels) / sum(kernels)
            attention[b, g] = dict(zip(tuples, weights.tolist(), strict=True))
            pooled = sum(
                w * math.prod(values[j][t, k_slice] for j, t in enumerate(steps))
                for w, steps in zip(weights, tuples, strict=True)
            )
            output[b, k_slice] = layer.pooling[g].T @ pooled
    return output, attention


def test_stacked_layers_follow_eq_13_against_a_brute_force_reference():
    """f_{n+1}^l = MAN(f_n^l, {V_j | j != l}) 1^T + f_n^l: each modality's own pass meets the
    ORIGINAL sequences of the others (m = 3, 2 layers, unequal lengths, padded steps)."""
    module = make(mode="exact", layers=2, chunks=2, lsc_scale=0.4, temperature=0.3)
    inputs, masks = inputs_and_masks()
    result = module(inputs, masks, return_details=True)

    with torch.no_grad():
        originals = [project(x) for project, x in zip(module.input_projections, inputs, strict=True)]
        current = list(originals)
        for layer in module.layers:
            passes = [
                man_pass_by_brute_force(
                    layer,
                    [current[j] if j == own else originals[j] for j in range(3)],
                    masks,
                    temperature=0.3,
                    chunks=2,
                    scale=0.4,
                )[0]
                for own in range(3)
            ]
            current = [f + g.unsqueeze(1) for f, g in zip(current, passes, strict=True)]
        expected_fused = module.output(sum(passes) / 3)  # read-out: mean of the last layer's passes

    torch.testing.assert_close(result.fused, expected_fused)
    for actual, expected, mask in zip(result.sequences, current, masks, strict=True):
        torch.testing.assert_close(actual[mask], expected[mask])  # real steps: Eq. 13
        assert torch.all(actual[~mask] == 0)  # padded steps stay empty


def test_shared_stacking_variant_adds_one_pass_over_the_updated_sequences():
    """The "shared" variant: one pass per layer over all updated sequences, the same
    vector added to every modality (brute-force reference as above)."""
    module = make(mode="exact", layers=2, chunks=2, lsc_scale=0.4, temperature=0.3, stacking="shared")
    inputs, masks = inputs_and_masks()
    result = module(inputs, masks, return_details=True)
    with torch.no_grad():
        current = [project(x) for project, x in zip(module.input_projections, inputs, strict=True)]
        for layer in module.layers:
            fused, _ = man_pass_by_brute_force(layer, current, masks, temperature=0.3, chunks=2, scale=0.4)
            current = [f + fused.unsqueeze(1) for f in current]
    torch.testing.assert_close(result.fused, module.output(fused))
    for actual, expected, mask in zip(result.sequences, current, masks, strict=True):
        torch.testing.assert_close(actual[mask], expected[mask])


def marginals_of(tensor):
    """(B, G, T_1, T_2, T_3) -> the per-modality marginals (B, G, T_j) (had mode's report)."""
    return [tensor.sum(dim=tuple(2 + k for k in range(3) if k != j)) for j in range(3)]


@pytest.mark.parametrize("mode", ["exact", "had"])
def test_stacked_attention_is_the_mean_over_the_passes(mode):
    """Layer 2 of an Eq. 13 stack reports the mean of its m passes' attention (the full
    tensor in exact mode, the per-modality marginals in had mode)."""
    # had mode with the paper's ARF, whose per-tuple weights the oracle writes out
    module = make(mode=mode, estimator="arf", layers=2, chunks=2, lsc_scale=0.4, temperature=0.3, exact_lsc=False)
    inputs, masks = inputs_and_masks()
    result = module(inputs, masks, return_details=True)
    had = mode == "had"
    options = {"temperature": 0.3, "chunks": 2, "scale": 0.4, "had": had}

    def reported(tensor):
        return marginals_of(tensor) if had else tensor

    with torch.no_grad():
        originals = [project(x) for project, x in zip(module.input_projections, inputs, strict=True)]
        first, weights = man_pass_by_brute_force(module.layers[0], originals, masks, **options)
        torch.testing.assert_close(result.attention[0], reported(attention_tensor(weights, 3, 3, LENGTHS)))
        current = [f + first.unsqueeze(1) for f in originals]
        expected = sum(
            attention_tensor(
                man_pass_by_brute_force(
                    module.layers[1],
                    [current[j] if j == own else originals[j] for j in range(3)],
                    masks,
                    **options,
                )[1],
                3,
                3,
                LENGTHS,
            )
            for own in range(3)
        ) / 3
    torch.testing.assert_close(result.attention[1], reported(expected))


def attention_tensor(weights, batch, heads, lengths):
    """{(b, g): {steps: weight}} as a (B, G, T_1, .., T_m) tensor, 0 at padded tuples."""
    tensor = torch.zeros(batch, heads, *lengths, dtype=DOUBLE)
    for (b, g), by_steps in weights.items():
        for steps, weight in by_steps.items():
            tensor[(b, g, *steps)] = weight
    return tensor


def test_exact_mode_returns_the_full_attention_tensor():
    module = make(mode="exact", chunks=3, lsc_scale=0.5, temperature=0.7)
    inputs, masks = inputs_and_masks()
    result = module(inputs, masks, return_details=True)
    with torch.no_grad():
        _, weights = man_pass_by_brute_force(
            module.layers[0], inputs, masks, temperature=0.7, chunks=3, scale=0.5
        )
    torch.testing.assert_close(result.attention[0], attention_tensor(weights, 3, 3, LENGTHS))
    # A one-layer MAN without residual updates returns its inputs, zero at padded steps.
    for sequence, x, mask in zip(result.sequences, inputs, masks, strict=True):
        torch.testing.assert_close(sequence, x * mask.unsqueeze(-1))


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="at least 2 modalities"):
        MAN([4], 2)
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        MAN([4, 4], 2, mode="fast")
    with pytest.raises(ValueError, match="cannot use LSC"):
        MAN([4, 4], 2, mode="hadamard", chunks=4)
    with pytest.raises(ValueError, match="not divisible by heads"):
        MAN([4, 4], 2, hidden_dim=10, heads=4)
    with pytest.raises(ValueError, match="unknown stacking 'deep'"):
        MAN([4, 4], 2, layers=2, stacking="deep")
    with pytest.raises(ValueError, match="residual"):
        MAN([4, 4], 2, layers=2, residual=False)
    assert MAN([4, 4], 2, mode="hadamard").layers[0].chunks == 0
    assert isinstance(polyfuse.nn.create("man", input_dims=[3, 3], out_dim=2), MAN)


def test_float32_survives_large_inputs():
    module = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16).eval()
    inputs, masks = inputs_and_masks()
    big = [100 * x.float() for x in inputs]
    # exp(w.a - |a|^2/2) overflows float32 at these sizes unless stabilised (note 5): the
    # float32 result must equal the same module's float64 result.
    wide = module(big, masks).double()
    reference = module.double()([x.double() for x in big], masks)
    assert torch.isfinite(wide).all()
    torch.testing.assert_close(wide, reference, rtol=1e-3, atol=1e-3 * reference.abs().max().item())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "fast"}, r"^MAN: unknown mode 'fast'; expected one of exact, hadamard, had, auto$"),
        ({"estimator": "orf"}, r"^MAN: unknown estimator 'orf'; expected one of gerf, arf$"),
        ({"layers": 2, "stacking": "deep"}, r"^MAN: unknown stacking 'deep'; expected one of [a-z_]+, [a-z_]+$"),
        ({"mode": "hadamard", "chunks": 4}, r"^MAN: hadamard mode \(w/o CAO\) cannot use LSC; set chunks=0$"),
        ({"layers": 2, "residual": False}, r"^MAN: stacked layers \(layers > 1\) are residual \(Eq. 13\); drop residual=False$"),
        ({"hidden_dim": 10, "heads": 4}, r"^MAN: hidden_dim 10 is not divisible by heads 4$"),
        ({"layers": 0}, r"^MAN: layers, heads and num_random_features must be >= 1 and chunks >= 0, got layers=0, heads=4, num_random_features=64, chunks=4$"),
        ({"heads": 0}, r"heads=0,"),
        ({"num_random_features": 0}, r"num_random_features=0,"),
        ({"chunks": -1}, r"chunks=-1$"),
    ],
)
def test_configuration_messages_name_the_value(options, message):
    with pytest.raises(ValueError, match=message):
        MAN([4, 4], 2, **options)


def test_smallest_sizes_and_defaults_as_built():
    tiny = MAN([4, 4], 2, hidden_dim=1, heads=1, num_random_features=1, chunks=0)  # all >= 1 is valid
    assert tiny.layers[0].random_matrix.shape[1] == 1
    default = MAN([4, 4], 2)
    layer = default.layers[0]
    assert (default.mode, layer.estimator, layer.random_matrix.shape[1], default.dropout.p) == ("auto", "gerf", 64, 0.0)
    assert (layer.exact_lsc, layer.exact_limit, default.redraw_in_training) == (True, None, False)
    assert layer.temperature == pytest.approx(1 / math.sqrt(layer.attention_dim))  # 1 / sqrt(K') by default
    same = MAN([64, 4], 64, layers=2)  # an input and the output of the hidden size: no projection for them
    assert isinstance(same.output, torch.nn.Identity) and isinstance(same.input_projections[0], torch.nn.Identity)
    assert isinstance(same.input_projections[1], torch.nn.Linear)


def test_the_seed_alone_fixes_random_features_and_pooling():
    # MAN's own generator (seed 0 by default) draws W and the pooling noise, whatever the global RNG.
    torch.manual_seed(1)
    first = MAN([4, 4], 2, layers=2)
    torch.manual_seed(2)
    second = MAN([4, 4], 2, layers=2)
    for a, b in zip(first.layers, second.layers, strict=True):
        assert torch.equal(a.random_matrix, b.random_matrix) and torch.equal(a.pooling, b.pooling)
    assert not torch.equal(first.layers[0].random_matrix, MAN([4, 4], 2, seed=1).layers[0].random_matrix)
    eye = torch.eye(first.layers[0].head_dim)
    noise = first.layers[0].pooling.detach() - eye  # P = I + 0.01 N(0, 1) per head
    assert 0 < noise.abs().max().item() < 0.06
    torch.manual_seed(3)
    first.redraw_random_features()  # from the module's own generator
    torch.manual_seed(4)
    second.redraw_random_features()
    assert torch.equal(first.layers[0].random_matrix, second.layers[0].random_matrix)


def layer_options(**overrides):
    options = {
        "hidden_dim": 6, "heads": 2, "attention_dim": 3, "num_random_features": 8, "orthogonal": True, "chunks": 2,
        "lsc_scale": 0.1, "mode": "exact", "temperature": 0.7, "generator": torch.Generator().manual_seed(5),
    }
    options.update(overrides)
    return options


def test_layer_defaults_and_its_own_messages():
    layer = MultiLinearAttentionLayer([4, 5], **layer_options())
    assert layer.estimator == "gerf"  # the layer's own default, as MAN's
    inputs, masks = inputs_and_masks()
    result = layer.double()([inputs[0][:, :, :4], inputs[1]], masks[:2])  # no flag: the fused tensor alone
    assert isinstance(result, torch.Tensor) and result.shape == (3, 6)
    with pytest.raises(ValueError, match="hidden_dim 7 is not divisible by heads 2"):
        MultiLinearAttentionLayer([4, 5], **layer_options(hidden_dim=7))


def test_layer_pooling_starts_at_identity_plus_the_generators_first_noise():
    layer = MultiLinearAttentionLayer([4, 5], **layer_options(generator=torch.Generator().manual_seed(9)))
    noise = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(9))  # P's noise is the first draw
    torch.testing.assert_close(layer.pooling.detach(), torch.eye(3).expand(2, 3, 3) + 0.01 * noise, rtol=0, atol=0)


def test_float64_layer_uses_float64_lsc_vectors():
    """lsc_scale 0.1 is not a float32 number: the LSC columns must be built in the features'
    dtype, as the brute-force pass builds them (exact mode, 1e-13)."""
    layer = MultiLinearAttentionLayer(DIMS, **layer_options(lsc_scale=0.1, temperature=2.0)).double()
    inputs, masks = inputs_and_masks()
    with torch.no_grad():
        expected, _ = man_pass_by_brute_force(layer, inputs, masks, temperature=2.0, chunks=2, scale=0.1)
        actual = layer(inputs, masks)
    torch.testing.assert_close(actual, expected, rtol=1e-13, atol=1e-14)


def test_float64_layer_uses_float64_lsc_vectors_for_equal_lengths():
    """The same with every modality of one length, where the layer builds all LSC vectors
    in one call (its other branch)."""
    layer = MultiLinearAttentionLayer(DIMS, **layer_options(lsc_scale=0.1, temperature=2.0)).double()
    inputs = [x[:, :3] for x in inputs_and_masks()[0]]
    masks = [torch.ones(3, 3, dtype=torch.bool) for _ in DIMS]
    masks[0][1, 2] = False
    masks[1][0, 1:] = False
    with torch.no_grad():
        expected, _ = man_pass_by_brute_force(layer, inputs, masks, temperature=2.0, chunks=2, scale=0.1)
        actual = layer(inputs, masks)
    torch.testing.assert_close(actual, expected, rtol=1e-13, atol=1e-14)


def test_the_joint_map_draws_every_value_map_then_every_feature_map():
    """U'_j and U''_j of modality j are one map (values' rows first), drawn as every
    modality's U'_j, then every modality's U''_j, each as its own nn.Linear (the order
    RESULTS.md's seeds drew them in); a state dict with the separate maps of polyfuse
    before 0.4.0 is refused by the strict load."""
    torch.manual_seed(3)
    module = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16)
    torch.manual_seed(3)
    values = [torch.nn.Linear(d, 12) for d in DIMS]
    features = [torch.nn.Linear(d, 12) for d in DIMS]
    for j in range(len(DIMS)):
        joint = module.layers[0].projections[j]
        assert joint.weight.equal(torch.cat([values[j].weight, features[j].weight]))
        assert joint.bias.equal(torch.cat([values[j].bias, features[j].bias]))
    old = {key.replace(".projections.", ".value_projections."): value for key, value in module.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"value_projections"):
        MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16).load_state_dict(old)


def test_operation_counts_at_the_sizes_of_issue_26():
    """Operations dispatched by one forward (eval, no_grad) and one forward+backward of MAN
    with its registry defaults at the sizes of issue 26 (out_dim 8, batch 8, inputs of
    sizes 300 / 74 / 35, lengths 20 / 30 / 25, random padding), after a warm-up call:
    417 and 847 before the modalities were stacked along time (main 71d5fea).
    Deterministic; see `polyfuse bench ops`."""
    from polyfuse.bench.dispatch import OpsSettings, count_module_operations, ops_inputs

    settings = OpsSettings()
    torch.manual_seed(0)
    model = MAN(list(settings.dims), settings.out_dim, mode="had", exact_lsc=False)
    forward, forward_backward = count_module_operations(model, *ops_inputs(settings, 3))
    assert forward.total <= 194
    assert forward_backward.total <= 410
    assert forward.by_name["aten.addmm"] == 4  # one joint map (U'_j, U''_j) per modality, the output map
    assert forward.by_name["aten.bmm"] == 5  # the exponents, m - 1 contractions, the last one's reordered one


def test_operation_counts_with_the_lsc_part_exact():
    """The default had path (LSC logits exact, issue 27) at the same sizes: 254 and 609
    operations when it was written (the chunk-tuple contraction; a backward that
    recomputes the random features rather than keep them, with autograd through the
    small chunk-tuple combination: 516 with plain autograd); 249 and 613 since the sum
    over tuples selects each modality's occupied chunks (issue 42). Guards against growth."""
    from polyfuse.bench.dispatch import OpsSettings, count_module_operations, ops_inputs

    settings = OpsSettings()
    torch.manual_seed(0)
    model = MAN(list(settings.dims), settings.out_dim, mode="had")
    forward, forward_backward = count_module_operations(model, *ops_inputs(settings, 3))
    assert forward.total <= 249
    assert forward_backward.total <= 613


@pytest.mark.parametrize(("limit", "expected"), [(None, "exact"), (3 * 16 * 12 * 10 - 1, "had"),
                                                 (3 * 16 * 12 * 10, "exact")])
@pytest.mark.parametrize("batch", [1, 5])
def test_auto_mode_follows_the_budget_rule(limit, expected, batch):
    """auto computes exact attention while heads x prod_j T_j (per sample, whatever the
    batch) <= exact_limit and had beyond, per call: its output then equals that of a
    module built in the chosen mode."""
    torch.manual_seed(0)
    auto = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16, exact_limit=limit).double().eval()
    chosen = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16, mode=expected).double().eval()
    chosen.load_state_dict(auto.state_dict())
    inputs = [torch.randn(batch, t, d, dtype=torch.float64) for t, d in zip((16, 12, 10), DIMS, strict=True)]
    result = auto(inputs, return_details=True)
    assert result.modes == [expected]
    torch.testing.assert_close(result.fused, chosen(inputs), rtol=1e-12, atol=1e-15)
    other = "had" if expected == "exact" else "exact"
    other_module = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16, mode=other).double().eval()
    other_module.load_state_dict(auto.state_dict())
    assert not torch.allclose(result.fused, other_module(inputs))


def test_the_functional_auto_mode_counts_the_tuples_of_one_sample():
    from polyfuse.functional import multilinear as ML

    features = torch.randn(4, 3, 5 + 6, 2, dtype=torch.float64)  # batch 4, 3 heads, lengths 5 and 6
    values = torch.randn(4, 3, 11, 2, dtype=torch.float64)
    matrix = torch.randn(3, 8, 2, dtype=torch.float64)
    exact = ML.stacked_multilinear_attention(features, values, (5, 6), mode="exact")
    had = ML.stacked_multilinear_attention(features, values, (5, 6), mode="had", random_matrix=matrix)
    for limit, expected in ((3 * 30, exact), (3 * 30 - 1, had)):
        auto = ML.stacked_multilinear_attention(features, values, (5, 6), mode="auto", random_matrix=matrix,
                                                exact_limit=limit)
        torch.testing.assert_close(auto, expected, rtol=0, atol=0)
        listed = ML.multilinear_attention(list(features.split((5, 6), -2)), list(values.split((5, 6), -2)),
                                          mode="auto", random_matrix=matrix, exact_limit=limit)
        torch.testing.assert_close(listed, expected, rtol=1e-12, atol=1e-14)
    assert ML.resolve_mode("had", 10**9) == "had" and ML.resolve_mode("exact", 10**9) == "exact"
    assert ML.resolve_mode("auto", ML.AUTO_EXACT_TUPLES) == "exact"
    assert ML.resolve_mode("auto", ML.AUTO_EXACT_TUPLES + 1) == "had"


def test_auto_mode_decides_per_call():
    torch.manual_seed(0)
    module = MAN(DIMS, 8, hidden_dim=12, heads=3, num_random_features=16, exact_limit=3 * 4**3).eval()
    batch_of_seven = [torch.randn(7, 4, d) for d in DIMS]
    assert module(batch_of_seven, return_details=True).modes == ["exact"]  # per sample, not per batch
    short = [torch.randn(1, 4, d) for d in DIMS]
    long = [torch.randn(1, 5, d) for d in DIMS]
    assert module(short, return_details=True).modes == ["exact"]
    assert module(long, return_details=True).modes == ["had"]
    assert module(short, return_details=True).modes == ["exact"]


def test_training_forwards_draw_fresh_features_reproducibly_and_resume_with_the_state_dict():
    inputs, masks = inputs_and_masks()
    module = make(mode="had", redraw_in_training=True).train()
    first = module.layers[0].random_matrix.clone()
    module(inputs, masks)
    second = module.layers[0].random_matrix.clone()
    assert not torch.equal(first, second)
    module(inputs, masks)
    assert int(module.draws) == 2
    module.eval()
    third = module.layers[0].random_matrix.clone()
    module(inputs, masks)
    assert torch.equal(module.layers[0].random_matrix, third)  # evaluation never draws
    # Draw n is a function of (seed, n): a module resumed from the state dict after two
    # draws makes the same third draw as the uninterrupted one.
    module.train()(inputs, masks)
    resumed = make(mode="had", redraw_in_training=True)
    twice = make(mode="had", redraw_in_training=True).train()
    twice(inputs, masks)
    twice(inputs, masks)
    resumed.load_state_dict(twice.state_dict())
    resumed.train()(inputs, masks)
    assert torch.equal(resumed.layers[0].random_matrix, module.layers[0].random_matrix)
    # Another seed draws other features.
    other = make(mode="had", seed=1, redraw_in_training=True).train()
    other(inputs, masks)
    assert not torch.equal(other.layers[0].random_matrix, second)


def test_a_state_dict_without_the_draws_is_refused_and_one_with_them_sets_the_count():
    module = make(mode="had")
    module.draws.fill_(5)
    loaded = make(mode="had")
    loaded.load_state_dict(module.state_dict())
    assert int(loaded.draws) == 5 and loaded._draws == 5
    state = {k: v for k, v in module.state_dict().items() if k != "draws"}
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "draws"'):
        make(mode="had").load_state_dict(state)


@pytest.mark.parametrize("mode", ["exact", "hadamard"])
def test_modes_without_random_features_draw_none(mode):
    module = make(mode=mode, redraw_in_training=True).train()
    before = module.layers[0].random_matrix.clone()
    module(*inputs_and_masks())
    assert torch.equal(module.layers[0].random_matrix, before) and int(module.draws) == 0
