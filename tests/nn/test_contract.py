"""One contract for every registered fusion module (STYLE.md habit 3): output shape,
finite values, a gradient for every parameter, float32 and float64, padding that
does not change the answer, and clear errors for bad input."""

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
