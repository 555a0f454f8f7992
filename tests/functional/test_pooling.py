"""Masked pooling over time (``polyfuse.functional.pooling``) against loops over the
real steps written here: the mean and the softmax restricted to the steps a mask keeps."""

import math

import pytest
import torch

from polyfuse.functional import masked_mean
from polyfuse.functional.pooling import masked_softmax

DOUBLE = torch.float64


def loop_mean(x, mask):
    """(..., T, d), (..., T) -> (..., d): sum over real steps / their count, zeros when none."""
    flat_x, flat_mask = x.reshape(-1, *x.shape[-2:]), mask.reshape(-1, mask.shape[-1])
    out = torch.zeros(flat_x.shape[0], x.shape[-1], dtype=x.dtype)
    for n in range(flat_x.shape[0]):
        real = [t for t in range(x.shape[-2]) if flat_mask[n, t]]
        for t in real:
            out[n] += flat_x[n, t]
        if real:
            out[n] /= len(real)
    return out.reshape(*x.shape[:-2], x.shape[-1])


def loop_softmax(logits, mask):
    """exp(l_t) / sum over real steps of exp(l_s) at real steps, 0 at padded ones."""
    flat_logits, flat_mask = logits.reshape(-1, logits.shape[-1]), mask.reshape(-1, mask.shape[-1])
    out = torch.zeros_like(flat_logits)
    for n in range(flat_logits.shape[0]):
        real = [t for t in range(flat_logits.shape[1]) if flat_mask[n, t]]
        total = sum(math.exp(float(flat_logits[n, t])) for t in real)
        for t in real:
            out[n, t] = math.exp(float(flat_logits[n, t])) / total
    return out.reshape(logits.shape)


@pytest.mark.parametrize("lead", [(), (1,), (2, 3)])
@pytest.mark.parametrize("length", [1, 2, 5])
def test_masked_mean_matches_loops_with_padding_counts_of_zero_one_and_many(lead, length):
    """Any number of leading dims (none, a batch of one, two), each length; samples with
    no real step (zeros), one real step (that step) and all steps real."""
    generator = torch.Generator().manual_seed(length)
    x = torch.randn(*lead, length, 4, generator=generator, dtype=DOUBLE)
    mask = torch.rand(*lead, length, generator=generator) > 0.5
    if lead == (2, 3):
        mask[0, 0] = False  # no real step: a zero vector
        mask[0, 1] = False
        mask[0, 1, -1] = True  # exactly one real step: that step itself
        mask[0, 2] = True  # every step real
    noisy = x.masked_fill(~mask.unsqueeze(-1), float("nan"))  # padded content is never read
    pooled = masked_mean(noisy, mask)
    torch.testing.assert_close(pooled, loop_mean(x, mask), rtol=1e-12, atol=1e-12)
    assert pooled.dtype == DOUBLE
    if lead == (2, 3):
        assert (pooled[0, 0] == 0).all()
        torch.testing.assert_close(pooled[0, 1], x[0, 1, -1], rtol=0, atol=0)
    half = masked_mean(noisy.half(), mask)  # the dtype of the input is kept
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.double(), loop_mean(x.half().double(), mask), rtol=2e-3, atol=2e-3)


def test_masked_softmax_matches_loops_and_gives_padded_steps_zero():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 6, generator=generator, dtype=DOUBLE) * 3
    mask = torch.rand(2, 3, 6, generator=generator) > 0.4
    mask[..., 2] = True
    mask[1, 2] = True
    probabilities = masked_softmax(logits, mask)
    torch.testing.assert_close(probabilities, loop_softmax(logits, mask), rtol=1e-12, atol=1e-12)
    assert (probabilities[~mask] == 0).all()
    # The last axis only: a square (T, T) input is normalised along its rows.
    square = logits[0, :, :3]
    square_mask = mask[0, :, :3]
    torch.testing.assert_close(masked_softmax(square, square_mask), loop_softmax(square, square_mask),
                               rtol=1e-12, atol=1e-12)
