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


@pytest.mark.parametrize("batch", [3, 2])  # 2: the smallest batch, and B != N_t = 3
def test_matching_loss_equals_eq11_loop(batch):
    _, _, wp, vp, wm, vm = _case()
    wp, vp, wm, vm = wp[:batch], vp[:batch], wm[:batch], vm[:batch]
    m = 0.8
    per_word = torch.zeros(batch, 3, dtype=torch.float64)
    count = 0
    for b in range(batch):
        for i in _words(wm, b):
            for j in _words(vm, b):
                pos = _d(wp[b, i], vp[b, j]) ** 2
                for b2 in range(batch):
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


def test_reductions_by_hand_and_the_default_margin():
    w, v, wp, vp, wm, vm = _case()
    per_word = word_region_matching_loss(wp, vp, wm, vm, margin=1.0, reduction="none")
    # Eq. 11's terms: every real word and region of image b with every real word of the
    # other captions: 3 words of caption 0 x 2 regions x (2 + 1) other words,
    # 2 x 1 x (3 + 1), 1 x 2 x (3 + 2)
    count = 3 * 2 * 3 + 2 * 1 * 4 + 1 * 2 * 5
    assert torch.allclose(word_region_matching_loss(wp, vp, wm, vm, reduction="sum"), per_word.sum(), rtol=1e-12)
    assert torch.allclose(word_region_matching_loss(wp, vp, wm, vm), per_word.sum() / count, rtol=1e-12)
    per_word = word_region_distortion_loss(wp, vp, w, v, wm, vm, reduction="none")
    pairs = 6 * 5  # 6 real words x 5 real regions
    summed = word_region_distortion_loss(wp, vp, w, v, wm, vm, reduction="sum")
    assert torch.allclose(summed, per_word.sum(), rtol=1e-12)
    assert torch.allclose(word_region_distortion_loss(wp, vp, w, v, wm, vm), per_word.sum() / pairs, rtol=1e-12)


def test_distortion_of_one_word_and_one_region_by_hand():
    # a word at tangent (1, 0) and a region at (0, 1): d_E = sqrt(2); on the hyperboloid,
    # cosh d_L = cosh(1)^2 (orthogonal directions, -<x, y>_L = cosh 1 cosh 1 - 0)
    word = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    region = torch.tensor([[[0.0, 1.0]]], dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.bool)
    expected = abs(math.acosh(math.cosh(1.0) ** 2) - math.sqrt(2.0)) / math.sqrt(2.0)
    args = (lorentz_expmap0(word), lorentz_expmap0(region), word, region, one, one)
    assert word_region_distortion_loss(*args).item() == pytest.approx(expected, rel=1e-12)
    assert word_region_distortion_loss(*args, reduction="sum").item() == pytest.approx(expected, rel=1e-12)
    # coinciding embeddings: d_E = 0 is floored at eps in the denominator
    same = word_region_distortion_loss(
        lorentz_expmap0(word), lorentz_expmap0(word), word, word, one, one, eps=1e-3
    )
    assert same.item() == 0.0
    shifted = lorentz_expmap0(word * 1.5)  # the points 0.5 apart, the embeddings not
    far = word_region_distortion_loss(shifted, lorentz_expmap0(word), word, word, one, one, eps=0.25)
    assert far.item() == pytest.approx(0.5 / 0.25, rel=1e-12)
    default = word_region_distortion_loss(shifted, lorentz_expmap0(word), word, word, one, one)
    assert default.item() == pytest.approx(0.5 / 1e-6, rel=1e-9)


def test_bad_inputs_are_refused_with_the_argument_named():
    w, v, wp, vp, wm, vm = _case()
    with pytest.raises(ValueError, match=r"^word_points must be a \(B, N, size\) float tensor$"):
        word_region_matching_loss(wp[0], vp, wm, vm)
    with pytest.raises(ValueError, match=r"^region_points must be a \(B, N, size\) float tensor$"):
        word_region_matching_loss(wp, vp.long(), wm, vm)
    with pytest.raises(ValueError, match=r"^word_points must be a \(B, N, size\) float tensor$"):
        word_region_matching_loss(wp.numpy(), vp, wm, vm)
    with pytest.raises(ValueError, match=r"^region_points_mask must be a bool tensor of shape \(3, 2\)$"):
        word_region_matching_loss(wp, vp, wm, vm.long())
    with pytest.raises(ValueError, match=r"^word_points_mask must be a bool tensor of shape \(3, 3\)$"):
        word_region_matching_loss(wp, vp, wm[:, :2], vm)
    with pytest.raises(ValueError, match=r"^word_points_mask must be a bool tensor"):
        word_region_matching_loss(wp, vp, wm.numpy(), vm)
    empty = vm.clone()
    empty[1] = False
    with pytest.raises(ValueError, match=r"^region_points: row 1 has no real position$"):
        word_region_matching_loss(wp, vp, wm, empty)
    with pytest.raises(ValueError, match=r"^word and region points need the same batch size, at least 2"):
        word_region_matching_loss(wp, vp[:2], wm, vm[:2])
    with pytest.raises(ValueError, match=r"^word and region points need the same batch size, at least 2"):
        word_region_matching_loss(wp[:1], vp[:1], wm[:1], vm[:1])
    with pytest.raises(ValueError, match=r"^margin must be positive, got 0.0$"):
        word_region_matching_loss(wp, vp, wm, vm, margin=0.0)
    with pytest.raises(ValueError, match=r"^reduction must be 'mean', 'sum' or 'none', got 'max'$"):
        word_region_matching_loss(wp, vp, wm, vm, reduction="max")
    with pytest.raises(ValueError, match=r"^word_embeddings must be a \(B, N, size\) float tensor$"):
        word_region_distortion_loss(wp, vp, w[0], v, wm, vm)
    with pytest.raises(ValueError, match=r"^region_embeddings_mask must be a bool tensor of shape \(3, 3\)$"):
        word_region_distortion_loss(wp, vp, w, v[:, :1].expand(3, 3, 2), wm, vm)
    with pytest.raises(ValueError, match=r"^eps must be positive, got -1.0$"):
        word_region_distortion_loss(wp, vp, w, v, wm, vm, eps=-1.0)
    with pytest.raises(ValueError, match=r"^eps must be positive, got 0.0$"):
        word_region_distortion_loss(wp, vp, w, v, wm, vm, eps=0.0)
    with pytest.raises(ValueError, match=r"^word_points must be a \(B, N, size\) float tensor$"):
        word_region_distortion_loss(wp[0], vp, w, v, wm, vm)
    with pytest.raises(ValueError, match=r"^region_points must be a \(B, N, size\) float tensor$"):
        word_region_distortion_loss(wp, vp.long(), w, v, wm, vm)
    with pytest.raises(ValueError, match=r"^reduction must be"):
        word_region_distortion_loss(wp, vp, w, v, wm, vm, reduction="avg")
