"""check_all_finite: one host read for many tensors, the full message for the first at fault."""

import pytest
import torch

import polyfuse
from polyfuse import _checks, validation
from polyfuse._checks import check_all_finite, inputs_checked


def triples(tensors, masks=None):
    masks = masks or [None] * len(tensors)
    return [(t, f"modality {j}", m) for j, (t, m) in enumerate(zip(tensors, masks, strict=True))]


def test_names_the_first_tensor_at_fault_not_the_first_tensor():
    tensors = [torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)]
    tensors[2][1, 2, 0] = float("nan")
    tensors[1][0, 1, 3] = float("-inf")
    with pytest.raises(ValueError, match=r"^modality 1 contains Inf at index \(0, 1, 3\)$"):
        check_all_finite(triples(tensors))
    tensors[1][0, 1, 3] = 0
    with pytest.raises(ValueError, match=r"^modality 2 contains NaN at index \(1, 2, 0\)$"):
        check_all_finite(triples(tensors))


def test_overflowing_sums_and_padded_steps_are_not_errors():
    big = torch.full((2, 3, 4), 3e38)  # finite, but its sum overflows to Inf
    padded = torch.zeros(2, 3, 4)
    padded[0, 2] = float("nan")
    mask = torch.tensor([[True, True, False], [True, True, True]])
    check_all_finite(triples([big, padded], [None, mask]))
    with pytest.raises(ValueError, match="modality 1 contains NaN"):
        check_all_finite(triples([big, padded]))


def test_skipped_at_shapes_level_and_for_checked_inputs():
    bad = torch.tensor([[[float("nan")]]])
    with validation("shapes"):
        check_all_finite(triples([bad]))
    with inputs_checked():
        check_all_finite(triples([bad]))
    check_all_finite([])
    with pytest.raises(ValueError, match="modality 0 contains NaN"):
        check_all_finite(triples([bad]))


def test_reads_synchronise_on_every_device_but_the_cpu_and_meta():
    assert not _checks.reads_synchronise(torch.device("cpu"))
    assert not _checks.reads_synchronise(torch.device("meta"))
    assert _checks.reads_synchronise(torch.device("cuda"))
    assert _checks.reads_synchronise(torch.device("mps"))


def test_full_checks_values_even_where_reads_synchronise(monkeypatch):
    """At "auto" a tensor where reads synchronise is not read; at "full" it is."""
    monkeypatch.setattr(_checks, "reads_synchronise", lambda device: True)
    bad = torch.tensor([[[float("nan")]]])
    _checks.check_finite(bad, "x")  # auto: not read
    with polyfuse.validation("full"), pytest.raises(ValueError, match="x contains NaN"):
        _checks.check_finite(bad, "x")
    with polyfuse.validation("shapes"):
        _checks.check_finite(bad, "x")


def test_stacked_steps_name_the_modality_and_the_sample_of_any_leading_dims():
    """A (B, G, T) mask of modalities of lengths 2, 3, 2 stacked along time: sample (1, 0)
    has no real step in modality 2; the message names both."""
    mask = torch.ones(2, 3, 7, dtype=torch.bool)
    mask[1, 0, 5:] = False
    with pytest.raises(ValueError, match=r"^mask: modality 2 is all padding for sample \(1, 0\): every sample "
                                         r"needs at least one real step in every modality$"):
        _checks.check_stacked_steps(mask, (2, 3, 2), "mask")
    mask[1, 0, 5] = True
    _checks.check_stacked_steps(mask, (2, 3, 2), "mask")  # one real step is enough
    mask[0, 2, :2] = False
    with pytest.raises(ValueError, match=r"modality 0 is all padding for sample \(0, 2\)"):
        _checks.check_stacked_steps(mask, (2, 3, 2), "mask")


def test_masks_of_the_wrong_kind_or_count_are_refused_naming_what_was_given():
    tensors = [torch.zeros(2, 3, 4), torch.zeros(2, 5, 4)]
    with pytest.raises(ValueError, match=r"^masks: expected a list of 2 masks \(or None\), got Tensor$"):
        _checks.check_masks(torch.ones(2, 3, dtype=torch.bool), tensors)
    with pytest.raises(ValueError, match=r"^masks: expected a list of 2 masks \(or None\), got 1$"):
        _checks.check_masks([torch.ones(2, 3, dtype=torch.bool)], tensors)
    full = _checks.check_masks([None, torch.ones(2, 5, dtype=torch.bool)], tensors)
    assert full[0].dtype == torch.bool and full[0].shape == (2, 3) and bool(full[0].all())
