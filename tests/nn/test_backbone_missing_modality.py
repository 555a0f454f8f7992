"""The default backbone (encoders, fusion, projection) with a missing modality: a sample
with no real step in one modality (length 0 in word-aligned data) is accepted by every
registered fusion module, its output does not depend on what those rows hold, and it
equals the fusion of a single zero step written by hand in its place."""

import pytest
import torch

import polyfuse
from polyfuse.nn.backbones import FusionBackbone, ModalityEncoder

DIMS = (5, 3, 4)
LENGTHS = ([4, 2, 3], [3, 0, 4], [1, 4, 2])  # per modality, per sample: sample 1 has no audio


def build(fusion, kind, skip):
    torch.manual_seed(0)
    encoders = [ModalityEncoder(d, kind=kind, hidden_dim=6, dropout=0.0) for d in DIMS]
    module = polyfuse.nn.create(fusion, input_dims=[6, 6, 6], out_dim=7)
    return FusionBackbone(module, encoders, fusion_dim=7, out_dim=8, skip=skip).eval()


def inputs_and_masks(fill):
    generator = torch.Generator().manual_seed(1)
    inputs, masks = [], []
    for j, d in enumerate(DIMS):
        x = torch.randn(3, 4, d, generator=generator)
        mask = torch.arange(4) < torch.tensor([LENGTHS[s][j] for s in range(3)])[:, None]
        x[~mask] = fill  # padded and missing rows hold `fill`
        inputs.append(x)
        masks.append(mask)
    return inputs, masks


@pytest.mark.parametrize("kind", ["linear", "gru"])
@pytest.mark.parametrize("fusion", [name for name in polyfuse.nn.available() if name != "ban"])
def test_missing_modality_is_one_zero_step_whatever_its_rows_hold(fusion, kind):
    model = build(fusion, kind, skip=True)
    outputs = [model(*inputs_and_masks(fill)) for fill in (0.0, 1e3, float("nan"))]
    assert torch.isfinite(outputs[0]).all()
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0], rtol=1e-5, atol=1e-6)
    # Oracle: sample 1 alone, its audio given to the fusion module as one real zero step.
    inputs, masks = inputs_and_masks(0.0)
    one = [x[1:2] for x in inputs]
    one_masks = [m[1:2] for m in masks]
    encoded = model.encode(one, one_masks)
    stand_in = [e if j != 1 else torch.zeros(1, 1, e.shape[-1]) for j, e in enumerate(encoded)]
    stand_in_masks = [m if j != 1 else torch.ones(1, 1, dtype=torch.bool) for j, m in enumerate(one_masks)]
    fused = model.fusion(stand_in, stand_in_masks)
    skip = [polyfuse.functional.masked_mean(e, m) for e, m in zip(encoded, one_masks, strict=True)]
    expected = model.projection(torch.cat([fused, *skip], dim=-1))
    torch.testing.assert_close(outputs[0][1:2], expected, rtol=1e-5, atol=1e-6)
    # the other samples are computed as if sample 1 were not in the batch
    torch.testing.assert_close(outputs[0][0:1], model(*[[x[0:1] for x in t] for t in inputs_and_masks(0.0)]),
                               rtol=1e-5, atol=1e-6)


def test_ban_accepts_a_missing_modality_in_the_default_backbone():
    torch.manual_seed(0)
    encoders = [ModalityEncoder(d, kind="linear", hidden_dim=6, dropout=0.0) for d in DIMS[:2]]
    module = polyfuse.nn.create("ban", input_dims=[6, 6], out_dim=7)
    model = FusionBackbone(module, encoders, fusion_dim=7, out_dim=8, skip=False).eval()
    outputs = []
    for fill in (0.0, float("nan")):
        inputs, masks = inputs_and_masks(fill)
        outputs.append(model(inputs[:2], masks[:2]))
    assert torch.isfinite(outputs[0]).all()
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)


def test_a_fusion_module_called_directly_still_refuses_an_all_padding_sample():
    module = polyfuse.nn.create("concat", input_dims=list(DIMS), out_dim=7)
    inputs, masks = inputs_and_masks(0.0)
    with pytest.raises(ValueError, match=r"modality 1.*all padding for sample\(s\) \[1\]"):
        module(inputs, masks)
