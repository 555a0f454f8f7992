"""Training-time word shuffling of Chimera (``chimera.train_shuffle_words``): the words of
every training caption in a random order, drawn afresh each epoch.

Chimera sec. 4.4 fine-tunes Table 4's rows "over the data with 20% of each of the images
and texts randomly masked, the order of the words in each sentence were randomly
shuffled"; Table 3 (EX2) "randomly shuffle[s] the order of the words in each input
sentence" (the test pass of ``polyfuse evaluate --shuffle-words`` / ``shuffled_test``).

The shuffle works on tokenised captions (word-piece ids): a *word* is a piece that does
not continue another (WordPiece's ``##`` prefix) followed by its continuation pieces;
the words move as wholes, and the fixed tokens ([CLS], [SEP], [PAD], [MASK]: every
special id but [UNK], which stands for a word) and padded positions stay where they are.
Caption ``row`` of epoch ``e`` of a run seeded ``s`` is permuted by a generator seeded
from ``(s, e, row)`` alone (:func:`item_seed`): the same whatever the batch it is in,
the number of processes, or a resume; no global generator is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from polyfuse.seeds import epoch_seed

__all__ = ["item_seed", "shuffle_word_pieces", "word_tables"]


def item_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of caption ``row``'s permutation in ``epoch`` of a run seeded ``seed``."""
    return (epoch_seed(seed, epoch) * 1_000_033 + int(row) * 7_927 + 31) % 2**63


def word_tables(tokenizer) -> tuple[list[int], Tensor]:
    """``(fixed_ids, continuation)`` of a Hugging Face WordPiece tokenizer: the ids that
    never move (its special ids but [UNK]) and (V,) bool, True at the ids of pieces that
    continue a word (``##...``)."""
    fixed = sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    continuation = torch.tensor([bool(t) and t.startswith("##") for t in tokens], dtype=torch.bool)
    return fixed, continuation


def shuffle_word_pieces(token_ids: Tensor, mask: Tensor, rows: Sequence[int] | Tensor, *, fixed_ids: Sequence[int],
                        continuation: Tensor, seed: int, epoch: int) -> Tensor:
    """(B, N) ids with the words of each caption permuted (module docstring).

    Args:
        token_ids: (B, N) word-piece ids; mask: (B, N) bool, True at real positions.
        rows: (B,) the caption of each row (its index in the split): the item of its seed.
        fixed_ids: ids that stay in place; continuation: (V,) bool, True at ``##`` pieces.
        seed, epoch: the run's seed and the epoch.

    Returns:
        A new (B, N) tensor; each row holds the same ids (a permutation of whole words in
        the positions of the movable pieces), fixed ids and padding untouched.
    """
    if token_ids.shape != mask.shape or token_ids.dim() != 2:
        raise ValueError(f"token_ids {tuple(token_ids.shape)} and mask {tuple(mask.shape)} must be the same (B, N)")
    rows = [int(r) for r in (rows.tolist() if isinstance(rows, Tensor) else rows)]
    if len(rows) != token_ids.shape[0]:
        raise ValueError(f"{len(rows)} rows for a batch of {token_ids.shape[0]} captions")
    movable = mask & ~torch.isin(token_ids, torch.as_tensor(list(fixed_ids), dtype=token_ids.dtype,
                                                            device=token_ids.device))
    continues = continuation.to(token_ids.device)[token_ids.clamp(0, continuation.numel() - 1)]
    out = token_ids.clone()
    for b, row in enumerate(rows):
        positions = movable[b].nonzero().flatten()
        if positions.numel() < 2:
            continue
        pieces = token_ids[b, positions]
        # a new word at every movable piece that does not continue the previous movable one
        adjacent = torch.ones_like(positions, dtype=torch.bool)
        adjacent[1:] = positions[1:] == positions[:-1] + 1
        starts = ~(continues[b, positions] & adjacent)
        starts[0] = True
        words = torch.tensor_split(pieces, starts.nonzero().flatten()[1:].tolist())
        generator = torch.Generator().manual_seed(item_seed(seed, epoch, row))
        order = torch.randperm(len(words), generator=generator).tolist()
        out[b, positions] = torch.cat([words[i] for i in order])
    return out
