"""check_all_finite: one host read for many tensors, the full message for the first at fault."""

import pytest
import torch

from polyfuse import validation
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
