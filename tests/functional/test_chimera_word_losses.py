"""Word-region HLM and L_D (Chimera Eq. 11, 12) against loops over the printed sums."""

import math

import pytest
import torch

from polyfuse.functional.chimera_word_losses import (
    word_region_distortion_loss,
    word_region_matching_loss,
)
from polyfuse.functional.lorentz import lorentz_expmap0


def _d(x, y):  # d_L = arcosh(-<x, y>_L), <x, y>_L = sum_{i>=1} x_i y_i - x_0 y_0
    inner = sum(float(a) * float(b) for a, b in zip(x[1:], y[1:], strict=True)) - float(x[0]) * float(y[0])
    return math.acosh(max(-inner, 1.0))


def _case():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 3, 2, generator=g, dtype=torch.float64) * 0.7
    v = torch.randn(3, 2, 2, generator=g, dtype=torch.float64) * 0.7
    wm = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]).bool()
    vm = torch.tensor([[1, 1], [1, 0], [1, 1]]).bool()
    return w, v, lorentz_expmap0(w), lorentz_expmap0(v), wm, vm


def _words(mask, b):
    return [i for i in range(mask.shape[1]) if mask[b, i]]


def test_matching_loss_equals_eq11_loop():
    _, _, wp, vp, wm, vm = _case()
    m = 0.8
    per_word = torch.zeros(3, 3, dtype=torch.float64)
    count = 0
    for b in range(3):
        for i in _words(wm, b):
            for j in _words(vm, b):
                pos = _d(wp[b, i], vp[b, j]) ** 2
                for b2 in range(3):
                    if b2 == b:
                        continue
                    for k in _words(wm, b2):
                        per_word[b, i] += max(0.0, m + pos - _d(wp[b2, k], vp[b, j]) ** 2)
                        count += 1
    got = word_region_matching_loss(wp, vp, wm, vm, margin=m, reduction="none")
    assert torch.allclose(got, per_word, atol=1e-9)
    mean = word_region_matching_loss(wp, vp, wm, vm, margin=m)
    assert mean.item() == pytest.approx(per_word.sum().item() / count, rel=1e-9)


def test_distortion_loss_equals_eq12_loop():
    w, v, wp, vp, wm, vm = _case()
    per_word = torch.zeros(3, 3, dtype=torch.float64)
    for b in range(3):
        for i in _words(wm, b):
            for c in range(3):
                for j in _words(vm, c):
                    euclid = float((w[b, i] - v[c, j]).norm())
                    per_word[b, i] += abs(_d(wp[b, i], vp[c, j]) - euclid) / euclid
    got = word_region_distortion_loss(wp, vp, w, v, wm, vm, reduction="none")
    assert torch.allclose(got, per_word, atol=1e-9)


def test_permuting_one_captions_words_permutes_its_terms_only():
    w, v, wp, vp, wm, vm = _case()
    order = torch.tensor([2, 0, 1])  # caption 0 has 3 real words
    wp2, w2 = wp.clone(), w.clone()
    wp2[0], w2[0] = wp[0, order], w[0, order]
    for loss in (
        lambda a, e: word_region_matching_loss(a, vp, wm, vm, reduction="none"),
        lambda a, e: word_region_distortion_loss(a, vp, e, v, wm, vm, reduction="none"),
    ):
        before, after = loss(wp, w), loss(wp2, w2)
        assert torch.allclose(after[0], before[0, order], atol=1e-12)  # row 0 permuted exactly
        assert torch.allclose(after[1:], before[1:], atol=1e-12)  # other captions unchanged
        assert after.sum().item() == pytest.approx(before.sum().item(), rel=1e-12)


def test_word_level_differs_from_sequence_level():
    # Replacing one word of caption 0 changes the word-level loss although the mean of
    # its word vectors (what a sequence-level loss sees) is kept fixed.
    w, _, wp, vp, wm, vm = _case()
    w2 = w.clone()
    w2[0, 0] += 0.5
    w2[0, 1] -= 0.5
    assert torch.allclose(w2[0].mean(0), w[0].mean(0))
    a = word_region_matching_loss(wp, vp, wm, vm)
    b = word_region_matching_loss(lorentz_expmap0(w2), vp, wm, vm)
    assert abs(a.item() - b.item()) > 1e-4


def test_row_without_words_is_refused():
    _, _, wp, vp, wm, vm = _case()
    wm = wm.clone()
    wm[2] = False
    with pytest.raises(ValueError, match="row 2"):
        word_region_matching_loss(wp, vp, wm, vm)
