"""MulT's crossmodal attention (Eq. 1 / 3) and sinusoidal positions against loops written
here from the equations, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.functional.crossmodal import multihead_attention, sinusoidal_positions

DTYPE = torch.float64


@pytest.mark.parametrize(("length", "dim"), [(5, 8), (3, 7), (4, 2), (2, 3), (3, 4), (2, 5)])  # h = 2: w_1 = 10000^-1
def test_sinusoidal_positions_by_loops(length, dim):
    """Row p: sin((p+1) w_i) for i < h, then cos((p+1) w_i), w_i = 10000^(-i / (h - 1));
    h = 1 has the single frequency 1; an odd dim ends with a zero column."""
    half = dim // 2
    table = sinusoidal_positions(length, dim, dtype=DTYPE)
    assert table.shape == (length, dim) and table.dtype == DTYPE
    for p in range(length):
        for i in range(half):
            w = 10000.0 ** (-i / (half - 1)) if half > 1 else 1.0
            assert table[p, i].item() == pytest.approx(math.sin((p + 1) * w), abs=1e-12)
            assert table[p, half + i].item() == pytest.approx(math.cos((p + 1) * w), abs=1e-12)
        if dim % 2:
            assert table[p, -1].item() == 0.0


def test_sinusoidal_positions_dtype_empty_and_errors():
    assert sinusoidal_positions(3, 4).dtype == torch.float32  # the default dtype
    torch.testing.assert_close(sinusoidal_positions(3, 4), sinusoidal_positions(3, 4, dtype=DTYPE).float())
    assert sinusoidal_positions(0, 4).shape == (0, 4)
    assert sinusoidal_positions(0, 5).shape == (0, 5)
    with pytest.raises(ValueError, match=r"^sinusoidal_positions: need length >= 0 and dim >= 2, got -1, 4$"):
        sinusoidal_positions(-1, 4)
    with pytest.raises(ValueError, match=r"^sinusoidal_positions: need length >= 0 and dim >= 2, got 3, 1$"):
        sinusoidal_positions(3, 1)


def _attention_by_loops(query, key, value, heads, key_mask=None, keep=None):
    """Per sample, head and query step: softmax over the real keys of q.k / sqrt(D / H),
    times the values; ``keep`` (B, H, T_q, T_k) multiplies the weights (dropout)."""
    batch, length_q, dim = query.shape
    length_k = key.shape[1]
    size = dim // heads
    out = torch.zeros(batch, length_q, dim, dtype=DTYPE)
    for b in range(batch):
        real = [j for j in range(length_k) if key_mask is None or bool(key_mask[b, j])]
        for h in range(heads):
            cols = slice(h * size, (h + 1) * size)
            for t in range(length_q):
                if not real:
                    continue  # a missing source: the row stays zero
                scores = [float(query[b, t, cols] @ key[b, j, cols]) / math.sqrt(size) for j in real]
                top = max(scores)
                exps = [math.exp(s - top) for s in scores]
                for j, e in zip(real, exps, strict=True):
                    weight = e / sum(exps)
                    if keep is not None:
                        weight *= float(keep[b, h, t, j])
                    out[b, t, cols] += weight * value[b, j, cols]
    return out


def _inputs(batch=3, length_q=4, length_k=5, dim=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, length_q, dim, generator=generator, dtype=DTYPE)
    key = torch.randn(batch, length_k, dim, generator=generator, dtype=DTYPE)
    value = torch.randn(batch, length_k, dim, generator=generator, dtype=DTYPE)
    mask = torch.ones(batch, length_k, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2] = False  # sample 2 has no source at all
    return query, key, value, mask


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_multihead_attention_matches_loops(heads):
    query, key, value, mask = _inputs()
    got = multihead_attention(query, key, value, heads=heads, key_mask=mask)
    torch.testing.assert_close(got, _attention_by_loops(query, key, value, heads, mask), rtol=1e-12, atol=1e-12)
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    unmasked = multihead_attention(query, key, value, heads=heads)
    torch.testing.assert_close(unmasked, _attention_by_loops(query, key, value, heads), rtol=1e-12, atol=1e-12)


def test_multihead_attention_gradients_are_finite_and_zero_for_a_missing_source():
    query, key, value, mask = _inputs()
    query.requires_grad_()
    key.requires_grad_()
    multihead_attention(query, key, value, heads=2, key_mask=mask).sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(key.grad).all()
    assert torch.equal(query.grad[2], torch.zeros_like(query.grad[2]))
    assert torch.equal(key.grad[1, 2:], torch.zeros_like(key.grad[1, 2:]))  # padded keys get nothing


def test_multihead_attention_dropout_on_the_weights_in_training_only():
    query, key, value, mask = _inputs()
    evaluated = multihead_attention(query, key, value, heads=2, key_mask=mask)
    assert torch.equal(multihead_attention(query, key, value, heads=2, key_mask=mask, dropout=0.5), evaluated)
    torch.manual_seed(5)
    trained = multihead_attention(query, key, value, heads=2, key_mask=mask, dropout=0.3, training=True)
    torch.manual_seed(5)
    keep = torch.nn.functional.dropout(torch.ones(3, 2, 4, 5, dtype=DTYPE), 0.3, True)  # the same draw
    assert 0 < int((keep == 0).sum()) < keep.numel()
    torch.testing.assert_close(trained, _attention_by_loops(query, key, value, 2, mask, keep), rtol=1e-12, atol=1e-12)
    # training without a dropout rate: no dropout (the default rate is 0)
    assert torch.equal(multihead_attention(query, key, value, heads=2, key_mask=mask, training=True), evaluated)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"query": lambda q: q[0]}, r"expected query \(B, T_q, D\) and key / value \(B, T_k, D\), got \(4, 6\), \(3, 5, 6\), \(3, 5, 6\)"),
        ({"key": lambda k: k[0]}, r"expected .*, got \(3, 4, 6\), \(5, 6\), \(3, 5, 6\)"),
        ({"value": lambda v: v[:, :4]}, r"expected .*, got \(3, 4, 6\), \(3, 5, 6\), \(3, 4, 6\)"),
        ({"key": lambda k: k[..., :4], "value": lambda v: v[..., :4]}, r"query \(3, 4, 6\) and key \(3, 5, 4\) disagree in B or D"),
        ({"key": lambda k: k[:2], "value": lambda v: v[:2]}, r"query \(3, 4, 6\) and key \(2, 5, 6\) disagree in B or D"),
        ({"heads": 4}, r"model size 6 is not divisible by heads=4"),
        ({"heads": 0}, r"model size 6 is not divisible by heads=0"),
        ({"key_mask": lambda m: m.int()}, r"key_mask must be bool of shape \(3, 5\), got torch.int32 \(3, 5\)"),
        ({"key_mask": lambda m: m[:, :4]}, r"key_mask must be bool of shape \(3, 5\), got torch.bool \(3, 4\)"),
    ],
)
def test_multihead_attention_errors_name_the_function_and_the_shapes(change, match):
    query, key, value, mask = _inputs()
    args = {"query": query, "key": key, "value": value, "key_mask": mask, "heads": 2}
    for name, edit in change.items():
        args[name] = edit(args[name]) if callable(edit) else edit
    with pytest.raises(ValueError, match="^multihead_attention: " + match):
        multihead_attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)
