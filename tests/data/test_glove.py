"""The one GloVe-format reader (data/formats/glove.py), by hand: rows, the vocabulary
filter, and bad files refused naming the file, the line and the word."""

import re

import pytest
import torch

from polyfuse.data.formats.glove import load_glove, read_glove


def test_read_glove_keeps_every_row_in_file_order(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("dog 1 2\n\nlonely\ncat 3 -4.5\ndog 5 6\n", encoding="utf-8")  # blank and one-field lines skipped
    table = read_glove(path)
    assert table.words == ["dog", "cat", "dog"]
    assert table.vectors.dtype == torch.float32
    torch.testing.assert_close(table.vectors, torch.tensor([[1.0, 2.0], [3.0, -4.5], [5.0, 6.0]]))
    only = read_glove(path, words={"cat", "emu"})
    assert only.words == ["cat"]
    torch.testing.assert_close(only.vectors, torch.tensor([[3.0, -4.5]]))


def test_load_glove_gives_the_last_row_of_a_repeated_word_and_counts_words_once(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("dog 1 2\ncat 3 4\ndog 5 6\n", encoding="utf-8")
    table, found = load_glove(path, ["emu", "dog", "cat"], dim=2)
    assert found == 2
    torch.testing.assert_close(table, torch.tensor([[0.0, 0.0], [5.0, 6.0], [3.0, 4.0]]))


def test_bad_files_are_refused_naming_file_line_and_word(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("dog 1 2\ncat 1 x\n", encoding="utf-8")
    message = f"^{re.escape(str(words))}, line 2: word 'cat': not a row of numbers$"
    with pytest.raises(ValueError, match=message):
        read_glove(words)
    with pytest.raises(ValueError, match=message):
        load_glove(words, ["cat"], dim=2)
    assert load_glove(words, ["dog"], dim=2)[1] == 1  # rows of other words are not parsed
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("dog 1 2\ncat 1 2 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{re.escape(str(ragged))}, line 2: word 'cat' has 3 values, expected 2$"):
        read_glove(ragged)
    empty = tmp_path / "empty.txt"
    empty.write_text("\nword\n", encoding="utf-8")
    for read in (lambda: read_glove(empty), lambda: load_glove(empty, ["word"], dim=2)):
        with pytest.raises(ValueError, match=f"^{re.escape(str(empty))} holds no word vectors$"):
            read()
    with pytest.raises(FileNotFoundError, match=f"^word vectors file {re.escape(str(tmp_path / 'none.txt'))} does not exist$"):
        read_glove(tmp_path / "none.txt")
