"""Training-time masking of Chimera's Table 4 protocol: a share of the words and regions.

Shapes: ``B`` sequences, ``N`` positions (padded; (B, N) bool masks, True at real ones).

"We performed fine-tuning over the data with 20% of each of the images and texts
randomly masked" (Chimera sec. 4.4). Per sequence, ``round(rate * n)`` of its ``n``
candidate positions are drawn uniformly without replacement (an exact count, not a
Bernoulli draw per position, so every caption of a batch is masked at the same rate):

* words: the chosen word pieces are replaced by the [MASK] id (always; BERT's 80/10/10
  split is not in the paper) and are the targets of L_T (Eq. 3). [CLS], [SEP] and
  padding are never chosen; at least one word piece is masked per caption, so that L_T
  has a target in every caption.
* regions: the chosen regions (video steps here) are dropped from the sequence's mask,
  so attention, pooling and the word-region losses never see them; at least one region
  is kept.

Draws come from an explicit ``torch.Generator``: the same generator state gives the same
masks.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["choose_positions", "drop_regions", "mask_word_pieces"]


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"the masking rate must lie in [0, 1), got {rate}")


def choose_positions(candidates: Tensor, rate: float, generator: torch.Generator, *, at_least: int = 0,
                     keep_at_least: int = 0) -> Tensor:
    """(B, N) bool: per row, round(rate * n) of its n candidate positions, uniformly at random.

    The count is clamped to [min(at_least, n), max(n - keep_at_least, 0)].

    Args:
        candidates: (B, N) bool, True where a position may be chosen.
        rate: share of each row's candidates to choose, in [0, 1).
        generator: the source of the draws.
        at_least: the smallest count per row (when it has that many candidates).
        keep_at_least: candidates of a row that are never all chosen.
    """
    _check_rate(rate)
    if not isinstance(candidates, Tensor) or candidates.dtype != torch.bool or candidates.dim() != 2:
        raise ValueError("candidates must be a (B, N) bool tensor")
    available = candidates.sum(1)
    count = torch.round(available.double() * rate).long()
    count = torch.maximum(count, available.clamp(max=at_least))
    count = torch.minimum(count, (available - keep_at_least).clamp_min(0))
    noise = torch.rand(candidates.shape, generator=generator).to(candidates.device)
    noise = noise.masked_fill(~candidates, 2.0)  # non-candidates sort last
    rank = noise.argsort(dim=1).argsort(dim=1)  # each position's place in a random order
    return (rank < count.unsqueeze(1)) & candidates


def mask_word_pieces(token_ids: Tensor, attention_mask: Tensor, special_ids: list[int], mask_id: int,
                     rate: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Replace round(rate * n) word pieces of each caption by [MASK] (at least one).

    Args:
        token_ids: (B, N) int64 word-piece ids. attention_mask: (B, N), nonzero at real tokens.
        special_ids: ids never masked ([CLS], [SEP], [PAD], ...). mask_id: the [MASK] id.
        rate: share of the word pieces to mask. generator: the source of the draws.

    Returns:
        ``(masked_ids, masked)``: (B, N) ids with [MASK] at the chosen positions, and the
        (B, N) bool positions (the targets of L_T; ``token_ids`` holds their words).
    """
    if not isinstance(token_ids, Tensor) or token_ids.dim() != 2 or token_ids.is_floating_point():
        raise ValueError("token_ids must be a (B, N) integer tensor")
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != token_ids.shape:
        raise ValueError(f"attention_mask must have the shape of token_ids, {tuple(token_ids.shape)}")
    candidates = attention_mask.bool() & ~torch.isin(token_ids, torch.tensor(special_ids, device=token_ids.device))
    masked = choose_positions(candidates, rate, generator, at_least=1)
    return token_ids.masked_fill(masked, mask_id), masked


def drop_regions(mask: Tensor, rate: float, generator: torch.Generator) -> Tensor:
    """(B, N) mask with round(rate * n) of each row's n real regions set False (one kept)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError("mask must be a (B, N) bool tensor")
    return mask & ~choose_positions(mask, rate, generator, keep_at_least=1)
