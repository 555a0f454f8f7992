"""Every registered fusion module: empty batches, bfloat16, float16 computed in float32
(or refused with a clear message), and a fuzz over modules x dtypes x scales x
lengths x masks that finds no NaN / Inf in outputs or gradients for finite inputs;
the numerically sensitive functions compute in float32 under autocast."""

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyfuse
from polyfuse._precision import (
    empty_output,
    float32_call,
    float32_under_autocast,
    needs_float32,
    widen_under_autocast,
)
from polyfuse.functional.contrastive import info_nce_loss
from polyfuse.functional.counting import count_features
from polyfuse.functional.pooling import masked_softmax

NAMES = polyfuse.nn.available()
DIMS = (4, 3, 5)
FUZZ = settings(
    max_examples=60, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def count_of(name):
    return 2 if polyfuse.nn.get(name).max_modalities == 2 else 3


@functools.cache
def float32_module(name):
    torch.manual_seed(0)
    return polyfuse.nn.create(name, input_dims=list(DIMS[: count_of(name)]), out_dim=6).eval()


def module_in(name, dtype):
    module = float32_module(name)
    copy = polyfuse.nn.create(name, input_dims=list(DIMS[: count_of(name)]), out_dim=6).eval()
    copy.load_state_dict(module.state_dict())
    return copy.to(dtype)


def inputs_for(name, batch, lengths, dtype, scale=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, t, d, generator=generator) * scale).to(dtype).requires_grad_()
        for t, d in zip(lengths, DIMS[: count_of(name)], strict=False)
    ]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_an_empty_batch_gives_an_empty_output(name, dtype):
    module = module_in(name, dtype)
    xs = inputs_for(name, 0, (5, 4, 3), dtype)
    out = module(xs, [torch.ones(0, x.shape[1], dtype=torch.bool) for x in xs])
    assert out.shape == (0, 6) and out.dtype == dtype
    out.sum().backward()  # the graph exists: a training step on an empty batch does not fail
    assert all(x.grad is not None and x.grad.shape == x.shape for x in xs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_agrees_with_float32_on_the_rounded_values(name, dtype):
    # Oracle: the float32 module with the same (rounded) weights on the same rounded inputs.
    low = module_in(name, dtype)
    reference = module_in(name, torch.float32)
    reference.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    xs = inputs_for(name, 3, (5, 4, 3), dtype)
    expected = reference([x.detach().float() for x in xs])
    out = low(xs)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    # float16 is computed in float32 (only the output is rounded); bfloat16 runs natively.
    tolerance = 2e-3 if dtype == torch.float16 else 0.1
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


@pytest.mark.parametrize("name", NAMES)
def test_float16_out_of_range_is_refused_with_a_message(name):
    module = module_in(name, torch.float16)
    xs = inputs_for(name, 2, (5, 4, 3), torch.float16, scale=1e4)
    try:
        out = module(xs)
        out.float().sum().backward()
    except ValueError as error:
        assert str(error).startswith(f"{type(module).__name__}: ") and "exceeds float16's range" in str(error)
        assert "bfloat16 or float32" in str(error)
    else:
        assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(x.grad).all()) for x in xs)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(NAMES))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    scale = draw(st.sampled_from([1e-4, 1e-2, 1.0, 1e2, 1e4]))
    batch = draw(st.integers(0, 3))
    lengths = tuple(draw(st.integers(1, 12)) for _ in range(count_of(name)))
    real = [[draw(st.integers(1, t)) for _ in range(batch)] for t in lengths]
    return name, dtype, scale, batch, lengths, real, draw(st.integers(0, 2**16))


@FUZZ
@given(cases())
def test_fuzz_no_silent_nan_or_inf(case):
    name, dtype, scale, batch, lengths, real, seed = case
    module = module_in(name, dtype)
    xs = inputs_for(name, batch, lengths, dtype, scale, seed)
    masks = [
        torch.arange(t)[None, :] < torch.tensor(r, dtype=torch.long).reshape(batch, 1)
        for t, r in zip(lengths, real, strict=True)
    ]
    try:
        out = module(xs, masks)
        out.float().square().mean().backward() if batch else out.sum().backward()
    except ValueError as error:
        # The only refusal allowed for finite inputs: float16 out of range, named clearly.
        assert dtype == torch.float16 and "exceeds float16's range" in str(error), str(error)
        return
    assert out.shape == (batch, 6)
    assert bool(torch.isfinite(out).all()), (name, dtype, scale)
    for x in xs:
        assert bool(torch.isfinite(x.grad).all()), (name, dtype, scale)
    for parameter_name, parameter in module.named_parameters():
        if parameter.grad is not None:
            assert bool(torch.isfinite(parameter.grad).all()), (name, dtype, scale, parameter_name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e2, 1e4])
def test_chimera_in_every_dtype_and_scale(dtype, scale):
    from polyfuse.nn.chimera import Chimera

    torch.manual_seed(0)
    module = Chimera(8).to(dtype)
    reference = Chimera(8)
    reference.load_state_dict({k: v.float() for k, v in module.state_dict().items()})
    generator = torch.Generator().manual_seed(1)
    text = (torch.randn(2, 5, 8, generator=generator) * scale).to(dtype).requires_grad_()
    image = (torch.randn(2, 4, 8, generator=generator) * scale).to(dtype).requires_grad_()
    out = module(text, image)
    assert out.hidden.dtype == dtype
    sum(x.float().sum() for x in out if x.is_floating_point()).backward()
    for value in (*out, text.grad, image.grad, *(p.grad for p in module.parameters() if p.grad is not None)):
        assert bool(torch.isfinite(value).all())
    if dtype == torch.float16:  # computed in float32: only the output is rounded
        expected = reference(text.detach().float(), image.detach().float())
        torch.testing.assert_close(out.hidden.float(), expected.hidden, rtol=2e-3, atol=2e-3 * expected.hidden.abs().max().item())
    empty = module(text[:0], image[:0])
    assert empty.hidden.shape == (0, 9, 8)


def test_maf_empty_batch():
    from polyfuse.nn.maf import MAF

    module = MAF([3, 4], 5, 6)
    out = module(torch.randn(0, 5), [torch.randn(0, 3, 3), torch.randn(0, 2, 4)])
    assert out.shape == (0, 6)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_maf_float16_is_computed_in_float32(scale):
    # Oracle: the float32 MAF with the same (rounded) weights on the same rounded inputs.
    from polyfuse.nn.maf import MAF

    torch.manual_seed(0)
    reference = MAF([3, 4], 5, 6, orders=(1, 2)).eval()
    half = MAF([3, 4], 5, 6, orders=(1, 2)).eval()
    half.load_state_dict(reference.state_dict())
    half = half.half()
    reference.load_state_dict({k: v.half().float() for k, v in reference.state_dict().items()})
    generator = torch.Generator().manual_seed(1)
    query = (torch.randn(2, 5, generator=generator) * scale).half()
    xs = [(torch.randn(2, t, d, generator=generator) * scale).half() for t, d in ((6, 3), (5, 4))]
    out = half(query, xs, return_details=True)
    expected = reference(query.float(), [x.float() for x in xs], return_details=True)
    assert out.fused.dtype == torch.float16
    torch.testing.assert_close(out.fused.float(), expected.fused, rtol=2e-3, atol=2e-3 * expected.fused.abs().max().item())
    for got, want in zip(out.attention, expected.attention, strict=True):
        torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=1e-3)


def test_man_float16_sequences_and_attention_are_computed_in_float32():
    torch.manual_seed(0)
    reference = polyfuse.nn.create("man", input_dims=[4, 3, 5], out_dim=6, hidden_dim=8, heads=2, layers=2).eval()
    half = polyfuse.nn.create("man", input_dims=[4, 3, 5], out_dim=6, hidden_dim=8, heads=2, layers=2).eval()
    half.load_state_dict(reference.state_dict())
    half = half.half()
    reference.load_state_dict({k: v.half().float() if v.is_floating_point() else v for k, v in reference.state_dict().items()})
    generator = torch.Generator().manual_seed(2)
    xs = [(torch.randn(2, t, d, generator=generator) * 20).half() for t, d in ((7, 4), (5, 3), (6, 5))]
    out = half(xs, return_details=True)
    expected = reference([x.float() for x in xs], return_details=True)
    assert out.fused.dtype == torch.float16 and all(s.dtype == torch.float16 for s in out.sequences)
    torch.testing.assert_close(out.fused.float(), expected.fused, rtol=2e-3, atol=2e-3 * expected.fused.abs().max().item())
    for got, want in zip(out.sequences, expected.sequences, strict=True):
        torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3 * want.abs().max().item())


@pytest.mark.parametrize("name", ["concat", "man"])
def test_mixed_float16_and_float32_calls_are_computed_in_float32(name):
    """float16 weights with float32 inputs, float32 weights with float16 inputs, and a
    float16 call followed by a float32 call on the same float16 module: each is computed
    in float32 (then cast to the inputs' dtype), so each equals the float32 module's
    output on the same values."""
    reference = float32_module(name)
    xs = inputs_for(name, 3, (5, 4, 3), torch.float32)
    halves = [x.detach().half() for x in xs]
    with torch.no_grad():
        expected = reference([x.float() for x in halves])
        half_module = module_in(name, torch.float16)
        widened = module_in(name, torch.float16).float()  # the float16 weights, widened
        first = half_module(halves)  # float16 in, float16 out
        second = half_module([x.float() for x in halves])  # float32 in, the same module
        torch.testing.assert_close(second, widened([x.float() for x in halves]))
        assert first.dtype == torch.float16 and second.dtype == torch.float32
        torch.testing.assert_close(first.float(), second, atol=2e-3, rtol=2e-3)
        mixed = reference(halves)  # float32 weights, float16 inputs
        assert mixed.dtype == torch.float16
        torch.testing.assert_close(mixed.float(), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("name", ["man", "ban"])
def test_float16_details_are_computed_in_float32_too(name):
    # return_details=True reaches the float32 call: the same fused values, with the details.
    low = module_in(name, torch.float16)
    xs = [x.detach() for x in inputs_for(name, 3, (5, 4, 3), torch.float16)]
    details = low(xs, return_details=True)
    assert isinstance(details, polyfuse.nn.FusionOutput)
    assert details.fused.dtype == torch.float16 and torch.equal(details.fused, low(xs))
    assert details.attention is not None


@pytest.mark.parametrize("name", NAMES)
def test_input_errors_name_the_module_class(name):
    module = float32_module(name)
    xs = [x.detach() for x in inputs_for(name, 2, (5, 4, 3), torch.float32)]
    xs[0] = xs[0].long()
    cls = type(module).__name__
    with pytest.raises(ValueError, match=rf"^{cls}: modality 0 has dtype torch.int64; expected a float tensor$"):
        module(xs)


# ---------------------------------------------------------- the helpers of polyfuse._precision, one by one


class _Steep(torch.nn.Module):
    """tanh(1e5 x): a small output whose gradient at 0 (1e5) exceeds float16's range."""

    def forward(self, x):
        return torch.tanh(x * 1e5)


class _Scale(torch.nn.Module):
    """x * 1e5: for inputs of 1 the output itself exceeds float16's range."""

    def forward(self, x):
        return x * 1e5


class _Buffers(torch.nn.Module):
    """x @ M[:, index]: a float buffer in a matrix product and an int64 buffer as an index."""

    def __init__(self):
        super().__init__()
        self.register_buffer("matrix", torch.arange(6.0).reshape(2, 3) / 4)
        self.register_buffer("index", torch.tensor([2, 0]))

    def forward(self, x):
        return x @ self.matrix[:, self.index]


ADVICE = r"exceeds float16's range \(\|x\| <= 65504\) for these inputs; run this module in bfloat16 or float32, or scale the inputs \(or the loss\) down$"


def test_float32_call_messages_name_the_module_and_what_overflowed():
    with pytest.raises(ValueError, match=r"^_Scale: the output " + ADVICE):
        float32_call(_Scale(), (torch.ones(2, dtype=torch.float16),))
    x = torch.zeros(2, dtype=torch.float16, requires_grad=True)
    out = float32_call(_Steep(), (x,))
    assert out.dtype == torch.float16 and torch.equal(out, torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^_Steep: a gradient " + ADVICE):
        out.sum().backward()


def test_float32_call_output_dtype_follows_the_first_float_input():
    embedding = torch.nn.Embedding(4, 3).half()  # no float input: float32 out
    out = float32_call(embedding, (torch.tensor([1, 3]),))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, embedding.weight.float()[[1, 3]])

    class Add(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    half, single = torch.ones(2, dtype=torch.float16), torch.ones(2)
    assert float32_call(Add(), (half, single)).dtype == torch.float16
    assert float32_call(Add(), (single, half)).dtype == torch.float32


def test_float32_call_widens_float_buffers_and_keeps_integer_ones():
    module = _Buffers().half()
    x = torch.tensor([[1.0, -2.0]], dtype=torch.float16)
    out = float32_call(module, (x,))
    expected = x.float() @ module.matrix.float()[:, [2, 0]]
    assert out.dtype == torch.float16 and module.index.dtype == torch.int64
    torch.testing.assert_close(out.float(), expected)


def test_empty_output_dtype_and_gradients():
    linear = torch.nn.Linear(3, 2)
    linear.out_dim = 2
    half_first = [torch.zeros(0, 4, 3, dtype=torch.float16, requires_grad=True), torch.zeros(0, 5, 3)]
    out = empty_output(linear, half_first)  # float32 weights, float16 first input: float16, like a full batch
    assert out.shape == (0, 2) and out.dtype == torch.float16
    assert empty_output(linear, half_first[::-1]).dtype == torch.float32
    with torch.no_grad():  # weights summing to zero: the graph's gradients stay zero, not 0 / 0
        linear.weight.zero_()
        linear.bias.zero_()
    out = empty_output(linear, half_first)
    out.sum().backward()
    assert torch.equal(linear.weight.grad, torch.zeros(2, 3)) and torch.equal(linear.bias.grad, torch.zeros(2))
    assert torch.equal(half_first[0].grad, torch.zeros(0, 4, 3, dtype=torch.float16))


def test_needs_float32_reads_inputs_then_weights_of_any_module():
    single, half = torch.ones(2), torch.ones(2, dtype=torch.float16)
    assert not needs_float32(torch.nn.Linear(2, 2), single)
    assert needs_float32(torch.nn.Linear(2, 2), half)
    assert needs_float32(torch.nn.Linear(2, 2).half(), single)  # a plain module: its parameters are read
    module = polyfuse.nn.create("concat", input_dims=[2, 2], out_dim=2)
    assert not needs_float32(module, single) and needs_float32(module.half(), single)  # the cached flag


# ---------------------------------------------------------- float32 islands under autocast


def _rounded(*shape, seed, scale=1.0):
    """Random bfloat16 values (already rounded, so that a float64 copy holds them exactly)."""
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def _man_inputs():
    features = [_rounded(2, t, 6, seed=t, scale=2.0) for t in (5, 3, 4)]
    values = [_rounded(2, t, 3, seed=10 + t) for t in (5, 3, 4)]
    masks = [torch.arange(t) < torch.tensor([[t], [t - 1]]) for t in (5, 3, 4)]
    random_matrix = polyfuse.functional.gaussian_random_matrix(8, 6, generator=torch.Generator().manual_seed(0))
    return features, values, masks, random_matrix


def _boxes(seed):
    corners = torch.rand(2, 6, 2, generator=torch.Generator().manual_seed(seed))
    return torch.cat([corners, corners + 0.3], dim=-1).bfloat16()


ISLANDS = {
    # name: (function of the inputs, inputs): each numerically sensitive function of the list in
    # polyfuse._precision's docstring, called on bfloat16 tensors
    "multilinear_attention had (MAN)": (
        lambda f, v, m, w: polyfuse.functional.multilinear_attention(f, v, m, mode="had", random_matrix=w),
        _man_inputs(),
    ),
    "multilinear_attention exact": (
        lambda f, v, m, w: polyfuse.functional.multilinear_attention(f, v, m, mode="exact"),
        _man_inputs(),
    ),
    "masked_softmax (HOCA, MAF)": (
        masked_softmax,
        (_rounded(3, 7, seed=1, scale=30.0), torch.arange(7) < torch.tensor([[7], [4], [1]])),
    ),
    "bilinear_attention_map (BAN)": (
        polyfuse.functional.bilinear_attention_map, (_rounded(2, 2, 4, 5, seed=2, scale=30.0),)
    ),
    "count_features (counter)": (
        lambda boxes, attention, weights: count_features(boxes, attention, weights, objects=4),
        (_boxes(3), _rounded(2, 6, seed=4, scale=3.0), (torch.rand(8, 17, generator=torch.Generator().manual_seed(5)) + 0.5).bfloat16()),
    ),
    "lorentz_expmap0 and lorentz_distance (Chimera)": (
        lambda x, y: polyfuse.functional.lorentz_distance(
            polyfuse.functional.lorentz_expmap0(x), polyfuse.functional.lorentz_expmap0(y)
        ),
        (_rounded(4, 5, seed=6, scale=2.0), _rounded(4, 5, seed=7, scale=2.0)),
    ),
    "info_nce_loss (retrieval)": (
        lambda scores, positives: info_nce_loss(scores, positives),
        (_rounded(5, 5, seed=8), torch.eye(5, dtype=torch.bool)),
    ),
}


@pytest.mark.parametrize("name", list(ISLANDS))
def test_sensitive_functions_compute_in_float32_under_autocast(name):
    """Under CPU bfloat16 autocast, on bfloat16 inputs, each returns float32 equal to its own
    float64 evaluation of the same (rounded) inputs to float32 accuracy: computed in
    float32 throughout, not in bfloat16 (whose 2^-9 rounding would show as ~1e-3)."""
    function, inputs = ISLANDS[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = function(*inputs)
    widened = [[x.double() if x.is_floating_point() else x for x in item] if isinstance(item, list)
               else item.double() if item.is_floating_point() else item for item in inputs]
    expected = function(*widened)
    assert output.dtype == torch.float32
    torch.testing.assert_close(output.double(), expected, rtol=2e-5, atol=2e-6 * float(expected.abs().max()))


def test_man_features_and_values_of_other_dtypes_under_autocast():
    """The reported failure: float32 features (the LSC vectors appended to bfloat16
    projections) beside bfloat16 values; under autocast both are computed in float32.
    Outside autocast the dtypes must still agree (a clear error)."""
    features, values, masks, random_matrix = _man_inputs()
    features = [a.float() for a in features]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = polyfuse.functional.multilinear_attention(features, values, masks, mode="had", random_matrix=random_matrix)
    expected = polyfuse.functional.multilinear_attention(
        features, [v.float() for v in values], masks, mode="had", random_matrix=random_matrix
    )
    assert output.dtype == torch.float32
    torch.testing.assert_close(output, expected)
    with pytest.raises(ValueError, match=r"modality 0: features have dtype torch\.float32 and values torch\.bfloat16"):
        polyfuse.functional.multilinear_attention(features, values, masks, mode="had", random_matrix=random_matrix)


def test_float32_under_autocast_widens_only_under_autocast():
    seen = {}

    @float32_under_autocast
    def record(x, pair, *, other):
        seen.update(x=x.dtype, pair=[t.dtype for t in pair], other=other.dtype, autocast=torch.is_autocast_enabled("cpu"))
        return x

    half, single, double = torch.ones(2, dtype=torch.bfloat16), torch.ones(2), torch.ones(2, dtype=torch.float64)
    assert record(half, [half, torch.ones(2, dtype=torch.float16)], other=half).dtype == torch.bfloat16
    assert seen == {"x": torch.bfloat16, "pair": [torch.bfloat16, torch.float16], "other": torch.bfloat16, "autocast": False}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert record(half, (single, double), other=torch.ones(2, dtype=torch.float16)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")  # restored after the call
    assert seen == {"x": torch.float32, "pair": [torch.float32, torch.float64], "other": torch.float32, "autocast": False}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert widen_under_autocast(half).dtype == torch.float32 and widen_under_autocast(double).dtype == torch.float64
    assert widen_under_autocast(half) is half


def test_float32_under_autocast_on_a_device_without_autocast():
    meta = torch.empty(2, dtype=torch.bfloat16, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert widen_under_autocast(meta) is meta and float32_under_autocast(torch.neg)(meta).dtype == torch.bfloat16
