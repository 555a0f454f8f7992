"""Beam search against greedy decoding and against brute-force enumeration of all captions."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from polyfuse.nn.beam_search import (
    Generated,
    _better,
    beam_search,
    greedy_search,
    normalised_score,
    score_captions,
)
from polyfuse.nn.decoding import CaptionDecoder

PAD, BOS, EOS = 0, 1, 2


def _decoder(seed: int, vocab: int = 6, orders="UB") -> tuple[CaptionDecoder, list[torch.Tensor]]:
    torch.manual_seed(seed)
    decoder = CaptionDecoder([5, 3], vocab, embed_dim=4, hidden_dim=6, orders=orders, attention_dim=4,
                             max_lengths=[4, 2])
    with torch.no_grad():  # sharper, more varied word distributions than the default init
        decoder.state_output.weight.mul_(6.0)
        decoder.embedding.weight.mul_(3.0)
    inputs = [torch.randn(3, 4, 5), torch.randn(3, 2, 3)]
    return decoder.eval(), inputs


def _oracle_log_prob(decoder: CaptionDecoder, inputs, caption: list[int], banned=()) -> list[float]:
    """sum_t log p_t(y_t) per video, by a separate teacher-forced loop written here (softmax
    over every token but padding, begin and ``banned``)."""
    sequences, masks = decoder.prepare(inputs)
    state = decoder.initial_state(sequences, masks)
    batch = sequences[0].shape[0]
    words = torch.full((batch,), BOS)
    total = torch.zeros(batch)
    for word in caption:
        output = decoder.step(words, state, sequences, masks)
        logits = output.logits.clone()
        logits[:, [PAD, BOS, *banned]] = -math.inf
        total += torch.log_softmax(logits, -1)[:, word]
        state, words = output.state, torch.full((batch,), word)
    return total.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_is_greedy(seed: int) -> None:
    decoder, inputs = _decoder(seed)
    greedy, _ = decoder.greedy(inputs, begin_index=BOS, end_index=EOS, max_length=7)
    beam = beam_search(decoder, inputs, begin_index=BOS, end_index=EOS, beam_size=1, max_length=7,
                       length_penalty=0.0, keep_greedy=False)
    assert torch.equal(beam.tokens, greedy)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("penalty", [0.0, 1.0])
def test_beam_never_scores_below_greedy(seed: int, penalty: float) -> None:
    decoder, inputs = _decoder(seed, orders=None if seed % 3 == 2 else "UB")
    options = {"begin_index": BOS, "end_index": EOS, "max_length": 6, "length_penalty": penalty}
    greedy = greedy_search(decoder, inputs, **options)
    beam = beam_search(decoder, inputs, beam_size=5, **options)
    # Rescore both with the oracle loop: the search's own bookkeeping is not trusted.
    for b in range(3):
        scores = []
        for tokens in (greedy.tokens[b], beam.tokens[b]):
            ids = [int(t) for t in tokens if int(t) != PAD]
            raw = _oracle_log_prob(decoder, inputs, ids)[b]
            scores.append(raw / len(ids) ** penalty)
        assert scores[1] >= scores[0] - 1e-5
        assert beam.scores[b].item() == pytest.approx(scores[1], abs=1e-4)
        assert greedy.scores[b].item() == pytest.approx(scores[0], abs=1e-4)


def _all_captions(words: list[int], max_length: int) -> list[list[int]]:
    """Every caption: some words then <eos>, or max_length words without it."""
    captions = []
    for length in range(0, max_length):
        captions += [[*prefix, EOS] for prefix in itertools.product(words, repeat=length)]
    captions += [list(prefix) for prefix in itertools.product(words, repeat=max_length)]
    return captions


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("penalty", [0.0, 1.0, 0.6])
@pytest.mark.parametrize("banned", [(), (5,)])
def test_wide_beam_finds_the_enumerated_optimum(seed: int, penalty: float, banned: tuple[int, ...]) -> None:
    # words 3, 4 and <eos> (5 banned, or absent): 1 + 2 + 4 + 8 ending in <eos>, 8 cut
    vocab, max_length = 5 + len(banned), 3
    decoder, inputs = _decoder(seed, vocab=vocab)
    if banned:  # the banned word would be the most probable one everywhere
        with torch.no_grad():
            decoder.state_output.bias[5] += 50.0
    captions = _all_captions([3, 4], max_length)
    table = torch.tensor([_oracle_log_prob(decoder, inputs, c, banned) for c in captions])  # (N, B)
    lengths = torch.tensor([float(len(c)) for c in captions]).unsqueeze(1)
    normalised = table / lengths**penalty
    # Beam width >= the unfinished prefixes of any step (2 ** 2): exhaustive.
    beam = beam_search(decoder, inputs, begin_index=BOS, end_index=EOS, beam_size=9,
                       max_length=max_length, length_penalty=penalty, keep_greedy=False, banned_tokens=banned)
    for b in range(3):
        best = int(normalised[:, b].argmax())
        found = [int(t) for t in beam.tokens[b] if int(t) != PAD]
        assert beam.scores[b].item() == pytest.approx(normalised[best, b].item(), abs=1e-5)
        assert found == captions[best]


UNK = 3


def _unknown_favoured(seed: int) -> tuple[CaptionDecoder, list[torch.Tensor]]:
    """A decoder whose most probable word is <unk> (id 3) at every step."""
    decoder, inputs = _decoder(seed, vocab=7)
    with torch.no_grad():
        decoder.state_output.bias[UNK] += 50.0
    return decoder, inputs


@pytest.mark.parametrize("seed", range(2))
def test_banned_unknown_is_never_generated(seed: int) -> None:
    decoder, inputs = _unknown_favoured(seed)
    options = {"begin_index": BOS, "end_index": EOS, "max_length": 5, "length_penalty": 1.0}
    allowed = beam_search(decoder, inputs, beam_size=3, **options)
    greedy_allowed, _ = decoder.greedy(inputs, begin_index=BOS, end_index=EOS, max_length=5)
    assert (allowed.tokens == UNK).any(dim=1).all() and (greedy_allowed == UNK).any(dim=1).all()
    banned = beam_search(decoder, inputs, beam_size=3, banned_tokens=[UNK], **options)
    greedy_banned = greedy_search(decoder, inputs, banned_tokens=[UNK], **options)
    for tokens in (banned.tokens, greedy_banned.tokens):
        assert not (tokens == UNK).any() and (tokens != PAD).any()
    # The greedy caption with the ban is the argmax over the allowed words, step by step.
    ids = [[int(t) for t in row if int(t) != PAD] for row in greedy_banned.tokens]
    for b in range(3):
        assert greedy_banned.log_probs[b].item() == pytest.approx(
            _oracle_log_prob(decoder, inputs, ids[b], (UNK,))[b], abs=1e-5)


def test_the_end_token_and_ids_outside_the_vocabulary_cannot_be_banned() -> None:
    decoder, inputs = _decoder(0)
    with pytest.raises(ValueError, match="end token cannot be banned"):
        beam_search(decoder, inputs, begin_index=BOS, end_index=EOS, banned_tokens=[EOS])
    with pytest.raises(ValueError, match="banned token 6 is not a token id"):
        decoder.greedy(inputs, begin_index=BOS, end_index=EOS, banned_tokens=[6])


def test_score_captions_matches_the_oracle_loop() -> None:
    decoder, inputs = _decoder(0)
    tokens = torch.tensor([[3, 4, EOS, PAD], [5, EOS, PAD, PAD], [4, 4, 5, 3]])
    generated, steps = score_captions(decoder, inputs, None, tokens, begin_index=BOS, end_index=EOS,
                                      length_penalty=0.0)
    for b, row in enumerate(tokens.tolist()):
        ids = [t for t in row if t != PAD]
        assert generated.log_probs[b].item() == pytest.approx(_oracle_log_prob(decoder, inputs, ids)[b], abs=1e-5)
    assert len(steps) == 4 and steps[0].attention[0].shape == (3, 4)


def test_bad_generation_arguments_are_named() -> None:
    decoder, inputs = _decoder(0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(decoder, inputs, begin_index=BOS, end_index=EOS, beam_size=0)
    with pytest.raises(ValueError, match="end token"):
        beam_search(decoder, inputs, begin_index=BOS, end_index=BOS)
    with pytest.raises(ValueError, match="max_length"):
        greedy_search(decoder, inputs, begin_index=BOS, end_index=EOS, max_length=0)


def test_generation_errors_name_the_argument_and_the_vocabulary() -> None:
    decoder, inputs = _decoder(0)
    cases = [
        ({"begin_index": BOS, "end_index": EOS, "max_length": 0}, r"^caption generation: max_length must be >= 1, got 0$"),
        ({"begin_index": 6, "end_index": EOS}, r"^caption generation: begin_index 6 is not a token id \(V = 6\)$"),
        ({"begin_index": -1, "end_index": EOS}, r"^caption generation: begin_index -1 is not a token id \(V = 6\)$"),
        ({"begin_index": BOS, "end_index": 6}, r"^caption generation: end_index 6 is not a token id \(V = 6\)$"),
        ({"begin_index": BOS, "end_index": PAD},
         r"^caption generation: the end token must differ from the begin and padding tokens$"),
        ({"begin_index": BOS, "end_index": BOS}, r"^caption generation: the end token must differ"),
    ]
    for options, message in cases:
        for search in (beam_search, greedy_search):
            with pytest.raises(ValueError, match=message):
                search(decoder, inputs, **options)
    with pytest.raises(ValueError, match=r"^beam_search: beam_size must be >= 1, got 0$"):
        beam_search(decoder, inputs, begin_index=BOS, end_index=EOS, beam_size=0)
    with pytest.raises(ValueError, match=r"^caption generation: end_index 6 is not a token id"):
        score_captions(decoder, inputs, None, torch.tensor([[3]] * 3), begin_index=BOS, end_index=6)


def test_normalised_score_and_the_better_of_two_generations_by_hand() -> None:
    log_prob = torch.tensor([-6.0, -2.0, -3.0])
    length = torch.tensor([4, 0, 2])
    assert normalised_score(log_prob, length, 0.5).tolist() == pytest.approx([-3.0, -2.0, -3.0 / math.sqrt(2)])
    assert normalised_score(log_prob, length, 1.0).tolist() == [-1.5, -2.0, -1.5]
    first = Generated(torch.tensor([[3, EOS, PAD], [4, 4, EOS]]), torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -6.0]))
    second = Generated(torch.tensor([[5, 3, 4, EOS], [3, EOS, PAD, PAD]]), torch.tensor([-1.0, -1.5]),
                       torch.tensor([-4.0, -3.0]))
    best = _better(first, second, PAD)  # row 0: a tie keeps the first; row 1: the second scores higher
    assert best.tokens.tolist() == [[3, EOS], [3, EOS]]  # cut to the longest caption
    assert best.scores.tolist() == [-1.0, -1.5] and best.log_probs.tolist() == [-2.0, -3.0]
    assert _better(first, second._replace(scores=torch.tensor([-9.0, -9.0])), PAD) is first
    wide = _better(first, second._replace(scores=torch.tensor([0.0, -9.0])), PAD)
    assert wide.tokens.tolist() == [[5, 3, 4, EOS], [4, 4, EOS, PAD]] and wide.log_probs.tolist() == [-4.0, -6.0]


@pytest.mark.parametrize("penalty", [1.0, 0.5])
def test_score_captions_normalises_by_the_generated_length(penalty: float) -> None:
    decoder, inputs = _decoder(1)
    tokens = torch.tensor([[3, EOS, PAD], [5, 4, 3], [EOS, PAD, PAD]])
    generated, _ = score_captions(decoder, inputs, None, tokens, begin_index=BOS, end_index=EOS,
                                  **({"length_penalty": penalty} if penalty != 1.0 else {}))
    for b, row in enumerate(tokens.tolist()):
        ids = [t for t in row if t != PAD]
        raw = _oracle_log_prob(decoder, inputs, ids)[b]
        assert generated.log_probs[b].item() == pytest.approx(raw, abs=1e-5)
        assert generated.scores[b].item() == pytest.approx(raw / len(ids) ** penalty, abs=1e-5)
    assert torch.equal(generated.tokens, tokens)
    empty, steps = score_captions(decoder, inputs, None, torch.zeros(3, 0, dtype=torch.long), begin_index=BOS,
                                  end_index=EOS)
    assert empty.scores.tolist() == [0.0] * 3 and steps == []


def test_normalised_score_in_the_score_dtype():
    # log p / |y|^alpha with the length cast to the scores' dtype: float64 scores keep
    # float64 precision (a float32 power of the length would be off by about 1e-8).
    log_prob = torch.tensor([-3.7, -12.25, -0.5], dtype=torch.float64)
    length = torch.tensor([3, 17, 0])
    got = normalised_score(log_prob, length, 0.7)
    expected = [-3.7 / 3**0.7, -12.25 / 17**0.7, -0.5 / 1**0.7]  # length 0 counts as 1
    assert got.dtype == torch.float64
    for value, reference in zip(got.tolist(), expected, strict=True):
        assert math.isclose(value, reference, rel_tol=1e-14)


def test_better_keeps_one_column_when_every_caption_is_one_token():
    # Both generations are the end token alone (length 1), padded to different widths:
    # the chosen rows are cut back to one column, the longest generated length.
    pad, end = 0, 2
    first = Generated(torch.tensor([[end, pad, pad]]), torch.tensor([-2.0]), torch.tensor([-2.0]))
    second = Generated(torch.tensor([[end]]), torch.tensor([-1.0]), torch.tensor([-1.0]))
    chosen = _better(first, second, padding_index=pad)
    assert chosen.tokens.tolist() == [[end]]
    assert chosen.scores.tolist() == [-1.0] and chosen.log_probs.tolist() == [-1.0]
