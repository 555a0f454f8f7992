"""Caption generation for :class:`~polyfuse.nn.decoding.CaptionDecoder`: batched beam
search with length normalisation, and the model score of given captions.

Legend for shapes: ``B`` batch, ``k`` beam size, ``V`` vocabulary size, ``S``
generated length (at most ``max_length``).

The model score of a caption ``y_1 .. y_S`` (``y_S`` the end token, or the
``max_length``-th word when the caption was cut) is the sum of the decoder's
log-probabilities ``sum_t log p_t(y_t | y_<t, V)`` (HOCA Eq. 22, 24; the softmax
taken over the tokens that may be generated) divided by
``S ** length_penalty`` (length normalisation; ``length_penalty = 0``: the plain
sum, ``1``: the mean log-probability per word). The padding and begin tokens are
never generated, nor the ``banned_tokens`` a caller names (the captioning task bans
``<unk>`` unless configured otherwise): the softmax is taken over the other tokens. The paper decodes with beam width 5 (section 5.2) and does not
say how it normalises lengths.

:func:`beam_search` keeps the ``k`` best unfinished captions per video at every
step; a caption that emits the end token among the ``k`` best candidates of the
step joins that video's finished list (the ``2k`` best candidates are examined so
that ``k`` unfinished ones remain). It
stops when no unfinished caption can still beat the best finished one (an exact
bound, since log-probabilities are <= 0) or at ``max_length``. Beam search can in
rare cases lose the greedy caption from its beam and end with a lower score than
greedy decoding; with ``keep_greedy=True`` (default) the greedy caption is decoded
as well and returned where it scores higher, so the result never scores below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from polyfuse.nn.decoding import CaptionDecoder, DecoderStep

__all__ = ["Generated", "beam_search", "greedy_search", "normalised_score", "score_captions"]


class Generated(NamedTuple):
    """Generated captions and their model scores."""

    tokens: Tensor  #: (B, S) ids, padded after the end token (which is kept)
    scores: Tensor  #: (B,) length-normalised model scores (what the search maximises)
    log_probs: Tensor  #: (B,) sums of log-probabilities


def normalised_score(log_prob: Tensor, length: Tensor, length_penalty: float) -> Tensor:
    """``log_prob / length ** length_penalty`` (length normalisation)."""
    return log_prob / length.to(log_prob.dtype).clamp_min(1) ** float(length_penalty)


def _check(decoder: CaptionDecoder, begin_index: int, end_index: int, max_length: int) -> None:
    if max_length < 1:
        raise ValueError(f"caption generation: max_length must be >= 1, got {max_length}")
    for name, index in (("begin_index", begin_index), ("end_index", end_index)):
        if not 0 <= index < decoder.vocab_size:
            raise ValueError(f"caption generation: {name} {index} is not a token id (V = {decoder.vocab_size})")
    if end_index in (begin_index, decoder.padding_index):
        raise ValueError("caption generation: the end token must differ from the begin and padding tokens")


def _log_probs(logits: Tensor, banned: Sequence[int]) -> Tensor:
    """log p_t (Eq. 22's softmax, in float32) over the tokens that may be generated."""
    logits = logits.float().clone()
    logits[:, list(banned)] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


def _lengths(tokens: Tensor, end_index: int, padding_index: int) -> Tensor:
    """(B,) generated length: up to and including the end token (pads after it excluded)."""
    return (tokens != padding_index).sum(dim=1) if tokens.numel() else tokens.new_zeros(tokens.shape[0])


@torch.no_grad()
def score_captions(
    decoder: CaptionDecoder,
    inputs: Sequence[Tensor],
    masks: Sequence[Tensor | None] | None,
    tokens: Tensor,
    *,
    begin_index: int,
    end_index: int,
    length_penalty: float = 1.0,
    banned_tokens: Sequence[int] = (),
) -> tuple[Generated, list[DecoderStep]]:
    """The model score of given captions, and the decoder's records at each of their steps.

    Args:
        tokens: (B, S) generated ids without the begin token, padded with the
            decoder's padding index after the end token.

    Returns:
        ``(Generated(tokens, scores, log_probs), steps)``; ``steps[t]`` holds the
        attention of step t (used by the captioning figure).
    """
    _check(decoder, begin_index, end_index, max(1, tokens.shape[1]))
    sequences, full_masks = decoder.prepare(inputs, masks)
    batch = sequences[0].shape[0]
    state = decoder.initial_state(sequences, full_masks)
    words = torch.full((batch,), begin_index, dtype=torch.long, device=sequences[0].device)
    total = torch.zeros(batch)
    steps = []
    banned = decoder.banned_ids(begin_index, end_index, banned_tokens)
    for t in range(tokens.shape[1]):
        output = decoder.step(words, state, sequences, full_masks)
        log_probs = _log_probs(output.logits, banned)
        alive = tokens[:, t] != decoder.padding_index
        picked = log_probs.gather(1, tokens[:, t : t + 1].clamp_min(0)).squeeze(1).cpu()
        total = total + torch.where(alive.cpu(), picked, torch.zeros_like(picked))
        steps.append(output)
        state, words = output.state, tokens[:, t]
    lengths = _lengths(tokens, end_index, decoder.padding_index).cpu()
    return Generated(tokens, normalised_score(total, lengths, length_penalty), total), steps


@torch.no_grad()
def greedy_search(
    decoder: CaptionDecoder,
    inputs: Sequence[Tensor],
    masks: Sequence[Tensor | None] | None = None,
    *,
    begin_index: int,
    end_index: int,
    max_length: int = 20,
    length_penalty: float = 1.0,
    banned_tokens: Sequence[int] = (),
) -> Generated:
    """Greedy decoding (:meth:`CaptionDecoder.greedy`) with the model scores of its captions."""
    _check(decoder, begin_index, end_index, max_length)
    tokens, _ = decoder.greedy(
        inputs, masks, begin_index=begin_index, end_index=end_index, max_length=max_length,
        banned_tokens=banned_tokens,
    )
    generated, _ = score_captions(
        decoder, inputs, masks, tokens, begin_index=begin_index, end_index=end_index,
        length_penalty=length_penalty, banned_tokens=banned_tokens,
    )
    return generated


@torch.no_grad()
def beam_search(
    decoder: CaptionDecoder,
    inputs: Sequence[Tensor],
    masks: Sequence[Tensor | None] | None = None,
    *,
    begin_index: int,
    end_index: int,
    beam_size: int = 5,
    max_length: int = 20,
    length_penalty: float = 1.0,
    keep_greedy: bool = True,
    banned_tokens: Sequence[int] = (),
) -> Generated:
    """Batched beam search (see the module docstring): the best caption per video.

    Args:
        inputs, masks: n modalities (B, T_i, d_i) and their (B, T_i) bool masks.
        beam_size: k; 1 with ``length_penalty=0`` is greedy decoding.
        max_length: most generated tokens, end token included.
        length_penalty: exponent of the length normalisation.
        keep_greedy: also decode greedily and keep the greedy caption where it scores higher.
        banned_tokens: ids never generated besides padding and begin (e.g. ``<unk>``).
    """
    _check(decoder, begin_index, end_index, max_length)
    if beam_size < 1:
        raise ValueError(f"beam_search: beam_size must be >= 1, got {beam_size}")
    banned = decoder.banned_ids(begin_index, end_index, banned_tokens)
    sequences, full_masks = decoder.prepare(inputs, masks)
    batch, k, vocab = sequences[0].shape[0], int(beam_size), decoder.vocab_size
    device = sequences[0].device
    beams = [x.repeat_interleave(k, dim=0) for x in sequences]  # (B k, T_i, d_i)
    beam_masks = [m.repeat_interleave(k, dim=0) for m in full_masks]
    state = decoder.initial_state(sequences, full_masks)
    state = type(state)(*(s.repeat_interleave(k, dim=0) for s in state))
    # Only the first beam of every video is alive at the start (all start from <bos>).
    alive_scores = torch.full((batch, k), float("-inf"))
    alive_scores[:, 0] = 0.0
    history = torch.empty((batch, k, 0), dtype=torch.long)
    words = torch.full((batch * k,), begin_index, dtype=torch.long, device=device)
    finished: list[list[tuple[float, float, list[int]]]] = [[] for _ in range(batch)]
    done = [False] * batch
    for step in range(max_length):
        output = decoder.step(words, state, beams, beam_masks)
        log_probs = _log_probs(output.logits, banned).cpu().view(batch, k, vocab)
        candidates = (alive_scores.unsqueeze(-1) + log_probs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)
        new_scores = torch.full((batch, k), float("-inf"))
        new_history = torch.zeros((batch, k, step + 1), dtype=torch.long)
        parents = torch.zeros((batch, k), dtype=torch.long)
        new_words = torch.full((batch, k), end_index, dtype=torch.long)
        length = step + 1
        for b in range(batch):
            if done[b]:
                continue
            kept = 0
            for rank, (score, index) in enumerate(zip(top_scores[b].tolist(), top_index[b].tolist(), strict=True)):
                if score == float("-inf"):
                    break
                parent, word = divmod(index, vocab)
                prefix = history[b, parent].tolist()
                if word == end_index or length == max_length:
                    if rank >= k:  # a caption ends only from among the k best candidates
                        continue
                    normalised = score / length ** float(length_penalty)
                    finished[b].append((normalised, score, [*prefix, word]))
                    continue
                if kept < k:
                    new_scores[b, kept] = score
                    new_history[b, kept, :step] = history[b, parent]
                    new_history[b, kept, step] = word
                    parents[b, kept], new_words[b, kept] = parent, word
                    kept += 1
            # Exact stop: log-probabilities are <= 0, so an unfinished caption's raw score
            # only falls, and its normalised score is at most raw / max_length ** penalty.
            best_alive = float(new_scores[b].max())
            bound = best_alive / max_length ** float(length_penalty) if best_alive > float("-inf") else best_alive
            best_finished = max((f[0] for f in finished[b]), default=float("-inf"))
            if kept == 0 or (len(finished[b]) >= k and best_finished >= bound):
                done[b] = True
        if all(done):
            break
        alive_scores, history = new_scores, new_history
        rows = (torch.arange(batch).unsqueeze(1) * k + parents).view(-1).to(device)
        state = type(output.state)(*(s.index_select(0, rows) for s in output.state))
        words = new_words.view(-1).to(device)
    best = [max(f, key=lambda item: item[0]) for f in finished]
    longest = max(len(tokens) for _, _, tokens in best)
    tokens = torch.full((batch, longest), decoder.padding_index, dtype=torch.long)
    for b, (_, _, ids) in enumerate(best):
        tokens[b, : len(ids)] = torch.tensor(ids)
    result = Generated(
        tokens.to(device),
        torch.tensor([normalised for normalised, _, _ in best]),
        torch.tensor([raw for _, raw, _ in best]),
    )
    if keep_greedy:
        greedy = greedy_search(
            decoder, inputs, masks, begin_index=begin_index, end_index=end_index,
            max_length=max_length, length_penalty=length_penalty, banned_tokens=banned_tokens,
        )
        result = _better(result, greedy, decoder.padding_index)
    return result


def _better(first: Generated, second: Generated, padding_index: int) -> Generated:
    """Per row, the generation with the higher normalised score (``first`` on ties)."""
    take = second.scores > first.scores
    if not bool(take.any()):
        return first
    width = max(first.tokens.shape[1], second.tokens.shape[1])

    def widen(tokens: Tensor) -> Tensor:
        pad = tokens.new_full((tokens.shape[0], width - tokens.shape[1]), padding_index)
        return torch.cat([tokens, pad], dim=1)

    tokens = torch.where(take.to(first.tokens.device).unsqueeze(1), widen(second.tokens), widen(first.tokens))
    lengths = (tokens != padding_index).sum(dim=1)
    tokens = tokens[:, : max(1, int(lengths.max()))]
    return Generated(
        tokens,
        torch.where(take, second.scores, first.scores),
        torch.where(take, second.log_probs, first.log_probs),
    )
