"""The fusion front end (polyfuse.nn.base.FusionModule) and the registries
(polyfuse.nn.registry.Registry), with small modules written here whose output is
known by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import polyfuse
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.registry import FUSIONS, Registry


class MeanSum(FusionModule):
    """fused = W (sum_j masked mean of x_j), written here: no attention."""

    min_modalities, max_modalities = 2, 3

    def __init__(self, input_dims, out_dim):
        super().__init__(input_dims, out_dim)
        self.weight = nn.Parameter(torch.arange(out_dim * input_dims[0], dtype=torch.float32).view(out_dim, -1))
        self.seen = None

    def fuse(self, inputs, masks):
        self.seen = (inputs, masks)
        means = [(x * m[..., None]).sum(1) / m.sum(1, keepdim=True) for x, m in zip(inputs, masks, strict=True)]
        return sum(means) @ self.weight.T


def test_fusion_module_zeroes_padding_fills_masks_and_fuses():
    module = MeanSum([2, 2], 3)
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [float("nan"), 0.0]]])
    y = torch.tensor([[5.0, 6.0]])  # a (B, d) vector: one step
    mask = torch.tensor([[True, True, False]])
    out = module([x, y], [mask, None])
    means = torch.tensor([2.0 + 5.0, 3.0 + 6.0])  # (1 + 3) / 2 + 5, (2 + 4) / 2 + 6
    torch.testing.assert_close(out, (module.weight.detach() @ means)[None], rtol=0, atol=0)
    seen_inputs, seen_masks = module.seen
    assert seen_inputs[0].tolist() == [[[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]] and seen_inputs[1].shape == (1, 1, 2)
    assert seen_masks[1].dtype == torch.bool and seen_masks[1].tolist() == [[True]]
    details = module([x, y], [mask, None], return_details=True)
    assert isinstance(details, FusionOutput) and details.sequences is None and details.attention is None
    torch.testing.assert_close(details.fused, out, rtol=0, atol=0)
    empty = module([x[:0], y[:0]], return_details=True)
    assert empty.fused.shape == (0, 3) and empty.sequences is None and empty.attention is None
    assert module([x[:0], y[:0]]).shape == (0, 3)
    assert module.num_modalities == 2 and module.input_dims == [2, 2] and module.out_dim == 3
    assert repr(module).startswith("MeanSum(input_dims=[2, 2], out_dim=3)")


def test_fusion_module_checks_its_sizes_and_the_number_of_modalities():
    with pytest.raises(ValueError, match=r"^MeanSum takes at least 2 and at most 3 modalities, got input_dims=\[2\]$"):
        MeanSum([2], 3)
    with pytest.raises(ValueError, match=r"^MeanSum takes at least 2 and at most 3 modalities, got "
                                         r"input_dims=\[2, 2, 2, 2\]$"):
        MeanSum([2, 2, 2, 2], 3)
    assert MeanSum([2, 2, 2], 3).num_modalities == 3

    class Pair(MeanSum):
        min_modalities, max_modalities = 2, 2

    class Many(MeanSum):
        min_modalities, max_modalities = 3, None

    with pytest.raises(ValueError, match=r"^Pair takes exactly 2 modalities, got input_dims=\[2, 2, 2\]$"):
        Pair([2, 2, 2], 3)
    with pytest.raises(ValueError, match=r"^Many takes at least 3 modalities, got input_dims=\[2, 2\]$"):
        Many([2, 2], 3)
    assert Many([2] * 9, 3).num_modalities == 9
    for dims, out in (([2, 0], 3), ([2, -1], 3), ([2, 2], 0), ([2, 2], -2)):
        with pytest.raises(ValueError, match=rf"^MeanSum: sizes must be positive, got input_dims=\[2, -?\d\], "
                                             rf"out_dim={out}$"):
            MeanSum(dims, out)
    assert MeanSum([2, 1], 1).out_dim == 1

    class Unfinished(FusionModule):
        pass

    with pytest.raises(NotImplementedError):
        Unfinished([2, 2], 1)([torch.ones(1, 2), torch.ones(1, 2)])


def test_the_float16_weights_flag_follows_the_weights():
    module = MeanSum([2, 2], 3)
    assert module.float16_weights is False
    module.half()
    assert module.float16_weights is True
    module.float()
    assert module.float16_weights is False
    module.extra = nn.Linear(2, 2).half()  # a new float16 submodule
    assert module.float16_weights is True
    module.extra = nn.Linear(2, 2)
    assert module.float16_weights is False
    module.scale = nn.Parameter(torch.ones(2, dtype=torch.float16))  # a new float16 parameter
    assert module.float16_weights is True
    module.scale = nn.Parameter(torch.ones(2))
    assert module.float16_weights is False


def test_registry_registers_gets_and_creates_by_lower_case_name():
    registry = Registry("widget", unknown_hint=" (see the docs)")

    @registry.register("Alpha")
    class Alpha(nn.Linear):
        pass

    assert Alpha.registry_name == "alpha" and registry.get("ALPHA") is Alpha and registry.get("alpha") is Alpha
    assert registry.register("alpha")(Alpha) is Alpha  # the same class again: fine
    registry.register("beta")(nn.Identity)
    assert registry.available() == ["alpha", "beta"] and registry.kind == "widget"
    layer = registry.create("alpha", in_features=2, out_features=3, bias=False)
    assert isinstance(layer, Alpha) and layer.weight.shape == (3, 2) and layer.bias is None
    with pytest.raises(ValueError, match=r"^widget name 'alpha' is already registered$"):
        registry.register("ALPHA")(nn.ReLU)
    with pytest.raises(ValueError, match=r"^unknown widget 'gamma'; available: alpha, beta \(see the docs\)$"):
        registry.get("gamma")
    with pytest.raises(ValueError, match=r"^unknown widget 3; available: alpha, beta \(see the docs\)$"):
        registry.get(3)
    assert Registry("thing").unknown_hint == ""
    with pytest.raises(ValueError, match=r"^unknown thing 'x'; available: $"):
        Registry("thing").get("x")


def test_the_fusion_registry_holds_every_module_by_name():
    assert polyfuse.nn.available() == FUSIONS.available() == sorted(FUSIONS.available())
    assert polyfuse.nn.get("MAN") is polyfuse.nn.MAN and polyfuse.nn.MAN.registry_name == "man"
    with pytest.raises(ValueError, match=r"^unknown fusion module 'nope'; available: ban, concat, hoca, lmf, "
                                         r"lowrank_hoca, maf, man, tfn$"):
        polyfuse.nn.create("nope", input_dims=[2, 2], out_dim=2)
    module = polyfuse.nn.create("concat", input_dims=[3, 2], out_dim=4)
    assert type(module).registry_name == "concat" and module.input_dims == [3, 2] and module.out_dim == 4
