"""One contract for every registered fusion module (STYLE.md habit 3): output shape,
finite values, a gradient for every parameter, float32 and float64, bfloat16 autocast
within a stated error of float32, padding that does not change the answer, and clear
errors for bad input."""

import pytest
import torch

import polyfuse

NAMES = polyfuse.nn.available()
LENGTHS = (5, 3, 4)
DIMS = (6, 5, 7)


def build(name, dtype=torch.float32):
    cls = polyfuse.nn.get(name)
    count = 2 if cls.max_modalities == 2 else 3
    torch.manual_seed(0)
    module = polyfuse.nn.create(name, input_dims=list(DIMS[:count]), out_dim=4)
    return module.to(dtype), count


def batch(count, dtype, seed=0, size=3):
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(size, t, d, generator=generator, dtype=dtype) for t, d in zip(LENGTHS[:count], DIMS[:count], strict=True)]
    masks = []
    for t in LENGTHS[:count]:
        mask = torch.ones(size, t, dtype=torch.bool)
        mask[1, t // 2 :] = False  # sample 1 is padded in every modality
        mask[2, 0] = False  # sample 2 has a padded first step
        masks.append(mask)
    return inputs, masks


def test_registry_lists_the_foundation_modules():
    for name in ("man", "ban", "concat", "tfn", "lmf"):
        assert name in NAMES


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown fusion module 'nope'; available: .*man"):
        polyfuse.nn.create("nope", input_dims=[2, 2], out_dim=2)


@pytest.mark.parametrize("name", NAMES)
def test_float32_output_and_a_gradient_for_every_parameter(name):
    module, count = build(name, torch.float32)
    module.train()
    inputs, masks = batch(count, torch.float32)
    output = module(inputs, masks)
    assert output.shape == (3, 4) and output.dtype == torch.float32
    output.pow(2).sum().backward()
    for parameter_name, parameter in module.named_parameters():
        assert parameter.grad is not None, f"{name}: no gradient for {parameter_name}"
        assert torch.isfinite(parameter.grad).all(), f"{name}: non-finite gradient for {parameter_name}"


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_finite_differences(name):
    """The gradient with respect to every input (real steps; padded steps get none) against
    central finite differences in float64: an oracle independent of the module's code
    (gradcheck's fast mode compares random projections u^T J v of the Jacobian)."""
    module, count = build(name, torch.float64)
    module.eval()  # no dropout: the function must be deterministic
    inputs, masks = batch(count, torch.float64)
    inputs = [x[:, :3].detach().requires_grad_(True) for x in inputs]
    masks = [m[:, :3] for m in masks]
    check = torch.autograd.gradcheck
    assert check(lambda *xs: module(list(xs), masks), tuple(inputs), eps=1e-6, atol=1e-5, fast_mode=True)


@pytest.mark.parametrize("name", NAMES)
def test_padding_changes_nothing(name):
    module, count = build(name, torch.float64)
    module.eval()
    inputs, masks = batch(count, torch.float64)
    reference = module(inputs, masks)
    noisy = [x.masked_fill(~m.unsqueeze(-1), 1e3) for x, m in zip(inputs, masks, strict=True)]
    torch.testing.assert_close(module(noisy, masks), reference, rtol=1e-12, atol=1e-12)
    # And the masks matter: without them the padded noise changes the result.
    assert not torch.allclose(module(noisy), reference)


@pytest.mark.parametrize("name", NAMES)
def test_vectors_are_sequences_of_length_one(name):
    module, count = build(name, torch.float64)
    module.eval()
    vectors = [torch.randn(2, d, dtype=torch.float64) for d in DIMS[:count]]
    torch.testing.assert_close(module(vectors), module([v.unsqueeze(1) for v in vectors]))


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_is_a_clear_error(name):
    module, count = build(name)
    inputs, masks = batch(count, torch.float32)
    with pytest.raises(ValueError, match="modalities"):
        module(inputs[:-1])
    with pytest.raises(ValueError, match="modalities"):
        module([*inputs, inputs[0]])
    bad = list(inputs)
    bad[1] = bad[1][:2]
    with pytest.raises(ValueError, match="modality 1 has batch size 2"):
        module(bad)
    bad = list(inputs)
    bad[1] = bad[1][..., :-1]
    with pytest.raises(ValueError, match="modality 1 has feature size"):
        module(bad)
    bad = list(inputs)
    bad[0] = bad[0].clone()
    bad[0][2, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"modality 0 contains NaN at index \(2, 1, 3\)"):
        module(bad)
    bad[0][2, 1, 3] = float("inf")
    with pytest.raises(ValueError, match="modality 0 contains Inf"):
        module(bad)
    empty = [m.clone() for m in masks]
    empty[count - 1][0] = False
    with pytest.raises(ValueError, match=rf"modality {count - 1}\) is all padding for sample\(s\) \[0\]"):
        module(inputs, empty)


# ---- mixed precision: CPU bfloat16 autocast ------------------------------------------------

#: Measured relative errors under CPU bfloat16 autocast against float32 (same weights, the
#: inputs of ``batch``, eval mode; torch 2.13 CPU): (output, gradient of the inputs), each
#: |x_bf16 - x_fp32| / |x_fp32| over the whole tensor. bfloat16 keeps 8 significant bits
#: (relative rounding 2^-9 = 0.2%), so errors of a few tenths of a percent are rounding;
#: a wrong computation moves the output far more (float32, these inputs: ignoring the masks
#: 25 to 66% for every module but TFN; modality 0 scaled by 1.05: 1.4 to 3.5% for every
#: module but TFN). The bounds are twice the measured values.
AUTOCAST_MEASURED = {
    "ban": (0.0077, 0.0138),  # glimpses batched (one bf16 product over all of them): was 0.0034, 0.0110
    "concat": (0.0020, 0.0037),
    "hoca": (0.0060, 0.0116),
    "lmf": (0.0055, 0.0070),
    "lowrank_hoca": (0.0070, 0.0143),
    "maf": (0.0060, 0.0116),
    "man": (0.0035, 0.0066),
    "tfn": (0.0035, 0.0070),
}


def relative_error(value, reference):
    return float((value.detach().float() - reference.detach()).norm() / reference.detach().norm())


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_autocast_forward_and_backward_stay_close_to_float32(name):
    """Forward under ``torch.autocast("cpu", bfloat16)`` and backward (outside it, as
    Lightning's bf16-mixed does): finite output and gradients of every input and every
    parameter, output and input gradients within the stated bound of float32's."""
    module, count = build(name, torch.float32)
    module.eval()  # no dropout: both runs compute the same function
    inputs, masks = batch(count, torch.float32)
    exact = [x.clone().requires_grad_(True) for x in inputs]
    expected = module(exact, masks)
    expected.pow(2).sum().backward()
    module.zero_grad(set_to_none=True)
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = module(leaves, masks)
    assert output.shape == (3, 4) and torch.isfinite(output).all()
    output.float().pow(2).sum().backward()
    for parameter_name, parameter in module.named_parameters():
        assert parameter.grad is not None, f"{name}: no gradient for {parameter_name}"
        assert torch.isfinite(parameter.grad).all(), f"{name}: non-finite gradient for {parameter_name}"
    assert all(torch.isfinite(x.grad).all() for x in leaves)
    output_bound, gradient_bound = (2 * error for error in AUTOCAST_MEASURED[name])
    assert relative_error(output, expected) <= output_bound
    for leaf, reference in zip(leaves, exact, strict=True):
        assert relative_error(leaf.grad, reference.grad) <= gradient_bound


def test_every_module_has_a_stated_autocast_error():
    assert set(AUTOCAST_MEASURED) == set(NAMES)


# ---- the one output type (FusionOutput) ------------------------------------------------

WITH_ATTENTION = {"man", "ban", "hoca", "lowrank_hoca", "maf"}
WITH_SEQUENCES = {"man", "ban"}


def test_every_module_is_listed_for_its_attention():
    """A newly registered module must say here whether it has attention (and the test
    below then checks it), so that no module escapes the attention contract."""
    known = {"man", "ban", "hoca", "lowrank_hoca", "maf", "concat", "tfn", "lmf"}
    assert set(NAMES) == known


def distributions(attention):
    """Flatten a FusionOutput.attention into its tensors."""
    if isinstance(attention, torch.Tensor):
        return [attention]
    return [t for item in attention for t in distributions(item)]


def joint_mask(tensor, masks, modalities):
    """The real-position mask of an attention tensor (B, [G,] T_a, T_b, ...) whose trailing
    axes are the time axes of ``modalities``, in order; returns it and those axes."""
    batch, time_axes = tensor.shape[0], list(range(tensor.dim() - len(modalities), tensor.dim()))
    mask = torch.ones((batch,) + (1,) * (tensor.dim() - 1), dtype=torch.bool)
    for axis, modality in zip(time_axes, modalities, strict=True):
        assert tensor.shape[axis] == LENGTHS[modality]
        shape = [batch] + [1] * (tensor.dim() - 1)
        shape[axis] = tensor.shape[axis]
        mask = mask & masks[modality].view(shape)
    return mask, time_axes


@pytest.mark.parametrize("name", NAMES)
def test_details_give_the_same_fused_output_and_valid_attention(name):
    module, count = build(name, torch.float64)
    module.eval()
    inputs, masks = batch(count, torch.float64)
    details = module(inputs, masks, return_details=True)
    assert isinstance(details, polyfuse.nn.FusionOutput)
    torch.testing.assert_close(details.fused, module(inputs, masks), rtol=1e-12, atol=1e-12)
    if name not in WITH_ATTENTION:
        assert details.attention is None
    else:
        tensors = distributions(details.attention)
        heads = 1 if name in ("man", "ban") else 0  # a head / glimpse axis after the batch
        for index, tensor in enumerate(tensors):
            # one marginal per modality, in order, or the joint distribution over all steps
            modalities = [index % count] if tensor.dim() == 2 + heads else list(range(count))
            mask, time_axes = joint_mask(tensor, masks, modalities)
            assert (tensor.masked_fill(mask, 0) == 0).all(), f"{name}: attention on padding"
            total = tensor.sum(dim=time_axes)
            torch.testing.assert_close(total, torch.ones_like(total))
    if name not in WITH_SEQUENCES:
        assert details.sequences is None
    else:
        assert len(details.sequences) == count
        for sequence, mask in zip(details.sequences, masks, strict=True):
            assert sequence.shape[:2] == mask.shape


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_reproduces_the_output(name):
    module, count = build(name, torch.float64)
    module.eval()
    cls = polyfuse.nn.get(name)
    torch.manual_seed(123)  # another initialisation (and another random matrix for MAN)
    other = cls(input_dims=list(DIMS[:count]), out_dim=4, **({"seed": 7} if name == "man" else {}))
    other = other.to(torch.float64).eval()
    inputs, masks = batch(count, torch.float64)
    assert not torch.allclose(other(inputs, masks), module(inputs, masks))
    other.load_state_dict(module.state_dict())
    torch.testing.assert_close(other(inputs, masks), module(inputs, masks), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_batch_with_details(name):
    module, count = build(name, torch.float64)
    inputs = [torch.zeros(0, t, d, dtype=torch.float64) for t, d in zip(LENGTHS[:count], DIMS[:count], strict=True)]
    details = module(inputs, return_details=True)
    assert details.fused.shape == (0, 4) and details.attention is None and details.sequences is None


# ---- torch.compile ------------------------------------------------------------------------


@pytest.fixture
def dynamo_with_rnns():
    """Dynamo's ``allow_rnn`` on: it would trace an LSTM into the graph, which polyfuse
    must keep out of it (TFN's and LMF's text LSTM runs eagerly, as one fused kernel)."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", NAMES)
def test_compiles_forward_and_backward_as_recommended(name, dynamo_with_rnns):
    """``polyfuse.nn.compile`` captures forward and backward and agrees with eager. The
    eager backend traces as inductor does but skips code generation (minutes on 2 cores
    for all modules); for TFN and LMF, whose graphs are cut around the LSTM, aot_eager
    also traces AOT autograd's forward and backward graphs of every piece (it triples
    the time of the others, which trace as one graph).

    Every module without a recurrent network compiles with ``fullgraph=True`` (any graph
    break fails it: a value read back by an input check, a packed sequence). TFN and
    LMF keep their LSTM out of the graph even where dynamo may trace it: no captured
    graph holds an LSTM."""
    from torch._dynamo.testing import CompileCounterWithBackend

    module, count = build(name, torch.float32)
    module.eval()
    inputs, masks = batch(count, torch.float32)
    has_lstm = any(isinstance(m, torch.nn.LSTM) for m in module.modules())
    counter = CompileCounterWithBackend("aot_eager" if has_lstm else "eager")
    compiled = polyfuse.nn.compile(module, backend=counter)
    torch.testing.assert_close(compiled(inputs, masks), module(inputs, masks))
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    compiled(leaves, masks).sum().backward()
    copies = [x.detach().requires_grad_(True) for x in inputs]
    expected = torch.autograd.grad(module(copies, masks).sum(), copies)
    for leaf, grad in zip(leaves, expected, strict=True):
        torch.testing.assert_close(leaf.grad, grad)
    targets = [str(node.target).lower() for graph in counter.graphs for node in graph.graph.nodes]
    assert not [t for t in targets if "lstm" in t or "rnn" in t]
    assert polyfuse.nn.traces_as_one_graph(module) is not has_lstm
    assert has_lstm is (name in ("tfn", "lmf"))  # the paper forms read text with an LSTM
    if has_lstm:
        assert counter.frame_count > 1  # graphs around the eager LSTM
        with pytest.raises(ValueError, match="cannot compile with fullgraph=True"):
            polyfuse.nn.compile(module, fullgraph=True, backend="eager")


def forward_without_host_reads(module, inputs, masks):
    """``module(inputs, masks)`` with every way of reading a tensor's value back to
    Python (bool, int, float, item, tolist, cpu, numpy) made to raise."""

    def forbidden(self, *args, **kwargs):
        raise HostRead("a tensor value was read back to the host")

    with pytest.MonkeyPatch.context() as patcher:
        for method in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"):
            patcher.setattr(torch.Tensor, method, forbidden)
        return module(inputs, masks)


class HostRead(Exception):
    pass


@pytest.mark.parametrize("name", NAMES)
def test_shapes_validation_reads_no_value_in_forward(name):
    module, count = build(name, torch.float32)
    module.eval()
    inputs, masks = batch(count, torch.float32)
    expected = module(inputs, masks)
    with pytest.raises(HostRead):  # the default level reads values (the harness works)
        forward_without_host_reads(module, inputs, masks)
    with polyfuse.validation("shapes"):
        output = forward_without_host_reads(module, inputs, masks)
    torch.testing.assert_close(output, expected)
    # and "full" reads values: it finds the NaN that "shapes" lets through
    bad = [x.clone() for x in inputs]
    bad[0][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        module(bad, masks)
    with polyfuse.validation("shapes"):
        module(bad, masks)  # no error: the caller vouches for the values


def test_validation_levels_are_checked():
    with pytest.raises(ValueError, match="unknown validation level 'some'"):
        polyfuse.set_validation("some")
    assert polyfuse.get_validation() == "auto"


@pytest.mark.parametrize("name", NAMES)
def test_the_default_level_reads_no_value_where_reads_synchronise(name, monkeypatch):
    """On a CUDA device a host read waits for the GPU. The default level ("auto") checks
    values only where reads are free: with the CPU made to count as such a device, a
    default forward and backward read no value (every read raises), and give what the
    checked call gives; on the real CPU the same call reads values (finds a NaN)."""
    module, count = build(name, torch.float32)
    module.eval()
    inputs, masks = batch(count, torch.float32)
    expected = module(inputs, masks)
    bad = [x.clone() for x in inputs]
    bad[0][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        module(bad, masks)  # CPU: values are checked by default
    monkeypatch.setattr(polyfuse._checks, "reads_synchronise", lambda device: True)
    assert polyfuse.get_validation() == "auto"
    leaves = [x.detach().requires_grad_(True) for x in inputs]

    def forward_backward(module, inputs, masks):
        output = module(inputs, masks)
        output.sum().backward()
        return output

    output = forward_without_host_reads(lambda *args: forward_backward(module, *args), leaves, masks)
    torch.testing.assert_close(output, expected)
    assert all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_a_default_forward_and_backward_never_synchronise_on_cuda(name):
    """On a GPU: with torch.cuda.set_sync_debug_mode("error"), every synchronising call
    raises; a default forward and backward make none."""
    module, count = build(name, torch.float32)
    module = module.cuda().eval()
    inputs, masks = batch(count, torch.float32)
    inputs = [x.cuda().requires_grad_(True) for x in inputs]
    masks = [m.cuda() for m in masks]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        module(inputs, masks).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(torch.isfinite(x.grad).all() for x in inputs)
