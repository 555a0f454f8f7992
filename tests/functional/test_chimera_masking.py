"""Table 4's training-time masking: exact counts per row, never special or padded tokens."""

import pytest
import torch

from polyfuse.functional.chimera_masking import choose_positions, drop_regions, mask_word_pieces

CLS, SEP, PAD, MASK = 101, 102, 0, 103


def _captions():
    # real word pieces per caption: 10, 5, 1, 3 (between [CLS] and [SEP], then padding)
    lengths = [10, 5, 1, 3]
    ids = torch.full((4, 12), PAD)
    for row, n in enumerate(lengths):
        ids[row, 0] = CLS
        ids[row, 1 : 1 + n] = torch.arange(2000, 2000 + n) + 100 * row
        ids[row, 1 + n] = SEP
    return ids, ids != PAD, lengths


def test_word_pieces_masked_at_the_rate_never_special_or_padding():
    ids, attention, lengths = _captions()
    masked_ids, masked = mask_word_pieces(ids, attention, [CLS, SEP, PAD, MASK], MASK, 0.2,
                                          torch.Generator().manual_seed(0))
    # round(0.2 n), at least one: 2, 1, 1, 1
    assert masked.sum(1).tolist() == [max(1, round(0.2 * n)) for n in lengths] == [2, 1, 1, 1]
    assert not masked[:, 0].any() and not (masked & ~attention).any()  # no [CLS], no padding
    assert not (masked & (ids == SEP)).any()
    assert (masked_ids[masked] == MASK).all() and torch.equal(masked_ids[~masked], ids[~masked])
    again, _ = mask_word_pieces(ids, attention, [CLS, SEP, PAD, MASK], MASK, 0.2, torch.Generator().manual_seed(0))
    assert torch.equal(again, masked_ids)  # the generator decides everything


def test_choice_is_uniform_over_the_candidates():
    candidates = torch.tensor([[True] * 10 + [False] * 2])
    generator = torch.Generator().manual_seed(0)
    counts = sum(choose_positions(candidates, 0.2, generator).long() for _ in range(4000))[0]
    assert counts[10:].sum() == 0 and counts.sum() == 4000 * 2
    assert (counts[:10] - 800).abs().max() < 80  # 800 expected per candidate; sd 25


def test_regions_dropped_at_the_rate_one_kept():
    mask = torch.tensor([[True] * 20, [True] * 3 + [False] * 17, [True] + [False] * 19])
    dropped = drop_regions(mask, 0.2, torch.Generator().manual_seed(3))
    assert (mask.sum(1) - dropped.sum(1)).tolist() == [4, 1, 0]  # round(0.2 n); the lone region stays
    assert not (dropped & ~mask).any()  # padded steps stay padded
    assert drop_regions(mask, 0.0, torch.Generator()).equal(mask)


def test_bad_rates_and_inputs_are_refused():
    ids, attention, _ = _captions()
    with pytest.raises(ValueError, match="masking rate"):
        mask_word_pieces(ids, attention, [CLS], MASK, 1.0, torch.Generator())
    with pytest.raises(ValueError, match="bool"):
        drop_regions(attention.long(), 0.2, torch.Generator())


def test_one_region_is_kept_when_the_rate_would_drop_them_all():
    # n = 1 at 0.6: round(0.6) = 1, clamped to n - 1 = 0; n = 3 at 0.9: round(2.7) = 3 -> 2
    mask = torch.tensor([[True] + [False] * 3, [True] * 3 + [False]])
    assert (mask.sum(1) - drop_regions(mask, 0.6, torch.Generator().manual_seed(0)).sum(1)).tolist() == [0, 2]
    assert drop_regions(mask, 0.9, torch.Generator().manual_seed(0)).sum(1).tolist() == [1, 1]
    # the drawn positions follow the generator: two seeds differ somewhere over many rows
    many = torch.ones(64, 10, dtype=torch.bool)
    first = drop_regions(many, 0.5, torch.Generator().manual_seed(1))
    assert torch.equal(first, drop_regions(many, 0.5, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, drop_regions(many, 0.5, torch.Generator().manual_seed(2)))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda ids, att: mask_word_pieces(ids.float(), att, [CLS], MASK, 0.2, torch.Generator()),
         r"token_ids must be a \(B, N\) integer tensor"),
        (lambda ids, att: mask_word_pieces(ids[0], att[0], [CLS], MASK, 0.2, torch.Generator()),
         r"token_ids must be a \(B, N\) integer tensor"),
        (lambda ids, att: mask_word_pieces(ids, att[:, :5], [CLS], MASK, 0.2, torch.Generator()),
         r"attention_mask must have the shape of token_ids, \(4, 12\)"),
        (lambda ids, att: drop_regions(att[0], 0.2, torch.Generator()), r"mask must be a \(B, N\) bool tensor"),
        (lambda ids, att: choose_positions(att.long(), 0.2, torch.Generator()),
         r"candidates must be a \(B, N\) bool tensor"),
        (lambda ids, att: choose_positions(att[0], 0.2, torch.Generator()), r"candidates must be a \(B, N\) bool tensor"),
    ],
)
def test_each_bad_input_is_named(call, message):
    ids, attention, _ = _captions()
    with pytest.raises(ValueError, match=message):
        call(ids, attention)
