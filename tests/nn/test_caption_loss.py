"""HOCA Eq. 24 with optional label smoothing, against the formula written out."""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.nn.decoding import caption_cross_entropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_smoothed_cross_entropy_by_hand(smoothing: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.tensor([[3, 4, 0], [2, 0, 0]])  # 0 is padding: 3 real tokens
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if targets[b, t] == 0:
                continue
            log_p = torch.log_softmax(logits[b, t], -1)
            total += (1 - smoothing) * -float(log_p[targets[b, t]]) + smoothing * -float(log_p.mean())
            count += 1
    got = caption_cross_entropy(logits, targets, 0, smoothing)
    assert math.isclose(float(got), total / count, rel_tol=1e-12)


def test_bad_smoothing_is_refused() -> None:
    with pytest.raises(ValueError, match="label_smoothing"):
        caption_cross_entropy(torch.zeros(1, 1, 3), torch.ones(1, 1, dtype=torch.long), 0, 1.0)
