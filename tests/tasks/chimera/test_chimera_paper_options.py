"""Chimera's paper settings: training-time word shuffling (``chimera.train_shuffle_words``,
sec. 4.4) and the one-directional L_TLM of Eq. 10 (``chimera.tlm_symmetric: false``)."""

import math

import lightning as L
import pytest
import torch
from tests.tiny.chimera import write_corpus_files, write_tiny_bert

from polyfuse.engine.config import resolve_config
from polyfuse.tasks.chimera.shuffling import item_seed, shuffle_word_pieces, word_tables
from polyfuse.tasks.chimera.spec import _Batches
from polyfuse.tasks.ranking.data import Shard
from polyfuse.tasks.registry import task_spec

CLS, SEP, PAD, MASK, UNK = 2, 3, 0, 4, 1
FIXED = [PAD, CLS, SEP, MASK]
CONTINUATION = torch.zeros(40, dtype=torch.bool)
CONTINUATION[30:] = True  # ids 30..39 are "##" pieces


def _words(row):
    """The words of a row (a piece and its ## continuations), in order."""
    words = []
    for token in row:
        if token in FIXED:
            continue
        if CONTINUATION[token] and words:
            words[-1] = (*words[-1], token)
        else:
            words.append((token,))
    return words


def test_shuffled_words_are_a_permutation_and_special_tokens_stay():
    ids = torch.tensor([[CLS, 10, 11, 30, 12, 13, UNK, 14, SEP, PAD, PAD],
                        [CLS, 20, 21, 22, SEP, PAD, PAD, PAD, PAD, PAD, PAD],
                        [CLS, 23, SEP, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD]])
    mask = ids != PAD
    out = shuffle_word_pieces(ids, mask, [5, 6, 7], fixed_ids=FIXED, continuation=CONTINUATION, seed=0, epoch=0)
    assert out.shape == ids.shape and out.dtype == ids.dtype
    for b in range(3):
        fixed = torch.isin(ids[b], torch.tensor(FIXED))
        assert torch.equal(out[b][fixed], ids[b][fixed])  # [CLS], [SEP], padding in place
        assert sorted(out[b].tolist()) == sorted(ids[b].tolist())  # the same multiset
        assert sorted(_words(out[b].tolist())) == sorted(_words(ids[b].tolist()))  # whole words moved
    assert not torch.equal(out[0], ids[0]) and not torch.equal(out[1], ids[1])  # >= 3 distinct words, this seed
    assert torch.equal(out[2], ids[2])  # one word: nothing to move
    assert (11, 30) in _words(out[0].tolist())  # "##" piece kept after its word
    # deterministic, and a row's order depends on (seed, epoch, row) only: not on its batch
    again = shuffle_word_pieces(ids, mask, [5, 6, 7], fixed_ids=FIXED, continuation=CONTINUATION, seed=0, epoch=0)
    assert torch.equal(again, out)
    alone = shuffle_word_pieces(ids[1:2], mask[1:2], [6], fixed_ids=FIXED, continuation=CONTINUATION, seed=0, epoch=0)
    assert torch.equal(alone[0], out[1])
    epochs = {tuple(shuffle_word_pieces(ids[:1], mask[:1], [5], fixed_ids=FIXED, continuation=CONTINUATION, seed=0,
                                        epoch=e)[0].tolist()) for e in range(4)}
    assert len(epochs) > 1  # drawn afresh each epoch
    assert item_seed(0, 1, 5) != item_seed(0, 0, 5) != item_seed(1, 0, 5) != item_seed(0, 0, 6)


def _orders(ids, rows=(0,), seeds=range(24)):
    """The distinct outputs of shuffling ``ids`` (B, N) under several run seeds."""
    mask = ids != PAD
    return {tuple(map(tuple, shuffle_word_pieces(ids, mask, list(rows), fixed_ids=FIXED, continuation=CONTINUATION,
                                                 seed=s, epoch=0).tolist())) for s in seeds}


def test_two_words_swap_and_every_row_of_a_batch_is_shuffled():
    two = torch.tensor([[CLS, 10, 11, SEP]])
    assert _orders(two) == {((CLS, 10, 11, SEP),), ((CLS, 11, 10, SEP),)}  # both orders of two words occur
    # a row with one word first does not stop the rows after it
    batch = torch.tensor([[CLS, 10, SEP, PAD], [CLS, 12, 13, 14]])
    assert len({order[1] for order in _orders(batch, rows=(0, 1))}) > 1


def test_word_boundaries_at_the_edges_of_the_vocabulary_and_of_the_caption():
    # a caption whose first movable piece is a "##" piece: that piece is a word of its own
    stray = torch.tensor([[CLS, 30, 10, 11, SEP]])
    assert any(order[0][2] != 10 for order in _orders(stray))
    # the vocabulary's last id continues a word: it never leaves the word before it
    last = torch.tensor([[CLS, 10, 39, 11, 12, SEP]])
    for order in _orders(last):
        row = list(order[0])
        assert row[row.index(10) + 1] == 39


def test_word_tables_of_a_wordpiece_tokenizer():
    from transformers import BertTokenizerFast

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "play", "##ing", "dog", "##s"]
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocabulary)})
    fixed, continuation = word_tables(tokenizer)
    assert fixed == [0, 2, 3, 4]  # the special ids but [UNK], which stands for a word
    assert continuation.tolist() == [False, False, False, False, False, False, True, False, True]


def test_shuffling_reads_no_global_generator():
    ids = torch.tensor([[CLS, 10, 11, 12, 13, 14, SEP]])
    torch.manual_seed(0)
    first = shuffle_word_pieces(ids, ids != PAD, [3], fixed_ids=FIXED, continuation=CONTINUATION, seed=1, epoch=2)
    state = torch.get_rng_state()
    torch.manual_seed(123)
    second = shuffle_word_pieces(ids, ids != PAD, [3], fixed_ids=FIXED, continuation=CONTINUATION, seed=1, epoch=2)
    assert torch.equal(first, second)
    torch.manual_seed(0)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not advanced


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _config(tmp_path, encoder_folder, **section):
    """A resolved configuration (every default filled in) over the tiny corpus and BERT."""
    section = {**write_corpus_files(tmp_path), "encoder_path": str(encoder_folder), "num_topics": 3,
               "hyperbolic_dim": 3, "shuffled_test": False, **section}
    return resolve_config({"task": {"type": "chimera"}, "seed": 2, "output_dir": str(tmp_path / "runs"),
                           "chimera": section, "data": {"batch_size": 3, "eval_batch_size": 3},
                           "optim": {"lr": 1e-3, "weight_decay": 1e-4}, "trainer": {"max_epochs": 1}})


def test_training_batches_are_shuffled_only_when_asked_and_alike_on_every_process(tmp_path, encoder_folder):
    spec = task_spec("chimera")
    pairs = [(0, 0), (1, 2), (2, 4), (3, 6)]
    modules = {}
    for shuffle in (False, True):
        config = _config(tmp_path, encoder_folder, train_shuffle_words=shuffle)
        data = spec.build_data(config)
        modules[shuffle] = spec.build_module(config, data)
        batches = [_Batches(data.prepared)("train", pairs, Shard(rank, world)) for rank, world in ((0, 1), (0, 2), (1, 2))]
    off, on = modules[False], modules[True]
    batch = batches[0]
    assert off.training_ids(batch) is batch["ids"]  # off: the batch's ids themselves, bit-identical
    shuffled = on.training_ids(batch)
    assert not torch.equal(shuffled, batch["ids"])
    assert torch.equal(shuffled[:, 0], batch["ids"][:, 0])  # [CLS] first
    for row, original, mask in zip(shuffled, batch["ids"], batch["id_mask"], strict=True):
        assert sorted(row.tolist()) == sorted(original.tolist())
        assert torch.equal(row[~mask], original[~mask])  # padding in place
        assert row[int(mask.sum()) - 1] == original[int(mask.sum()) - 1]  # [SEP] last
    for other in batches[1:]:  # each of 2 processes shuffles the global batch alike
        assert torch.equal(on.training_ids(other), shuffled)
    # a run with shuffled, unmasked captions (encoded every step) trains
    config = _config(tmp_path, encoder_folder, train_shuffle_words=True, mask_rate=0.0)
    data = spec.build_data(config)
    assert data.prepared.train_ids is not None and "train" not in data.prepared.tokens
    module = spec.build_module(config, data)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(module, datamodule=data.datamodule)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


def _eq10(texts, videos, temperature=1.0):
    """Chimera Eq. 10, loop by loop: -mean_b log exp phi(t_b, i_b) / (exp phi(t_b, i_b) + sum_{n != b} exp phi(t_b, i_n))."""
    total = 0.0
    for b in range(len(texts)):
        phi = [float(texts[b] @ videos[n]) / temperature for n in range(len(videos))]
        negatives = sum(math.exp(phi[n]) for n in range(len(videos)) if n != b)
        total += -math.log(math.exp(phi[b]) / (math.exp(phi[b]) + negatives))
    return total / len(texts)


@pytest.mark.parametrize("symmetric", [False, True])
def test_tlm_symmetric_false_is_eq10_on_a_3x3_batch(tmp_path, encoder_folder, symmetric):
    spec = task_spec("chimera")
    config = _config(tmp_path, encoder_folder, mask_rate=0.0, tlm_symmetric=symmetric, tlm_temperature=0.5)
    data = spec.build_data(config)
    module = spec.build_module(config, data)
    batch = _Batches(data.prepared)("train", [(0, 0), (1, 2), (2, 4)])
    with torch.no_grad():
        text = module.model.texts(batch["tokens"], batch["text_mask"])
        video = module.model.videos(batch["steps"], batch["video_mask"])
        _, terms = module._losses(text, video, None, [3], batch["text_mask"], batch["video_mask"])
    texts, videos = text.topics.double(), video.topics.double()
    assert texts.shape[0] == videos.shape[0] == 3
    forward = _eq10(texts, videos, 0.5)
    expected = 0.5 * (forward + _eq10(videos, texts, 0.5)) if symmetric else forward
    assert float(terms["topic_matching"]) == pytest.approx(expected, rel=1e-5)
    assert abs(forward - _eq10(videos, texts, 0.5)) > 1e-4  # the two forms differ on this batch
