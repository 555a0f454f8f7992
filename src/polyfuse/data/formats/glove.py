"""Word vectors from a GloVe-format text file (``word v_1 ... v_d`` per line).

The one reader of such files: :func:`read_glove` gives the words and their vectors
(every row, or those of a vocabulary); :func:`load_glove` gives a vocabulary's table, zero
rows for words not in the file (VQA's and captioning's word embeddings);
:meth:`polyfuse.nn.sentence_encoder.StaticWordEncoder.from_file` builds retrieval's
static text encoder from the whole file.

Lines split on single spaces only: a word may hold other whitespace (the 840B vectors
have such tokens); trailing whitespace is dropped, and a line with fewer than two fields
(blank, or a word alone) is skipped.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["WordVectors", "load_glove", "read_glove"]


class WordVectors(NamedTuple):
    """``words`` in file order (a word listed twice appears twice) and ``vectors``
    (len(words), d) float32, one row per word."""

    words: list[str]
    vectors: Tensor


def read_glove(path: str | Path, *, words: Collection[str] | None = None, dim: int | None = None) -> WordVectors:
    """The rows of a GloVe-format file: all of them, or only those of ``words``.

    Args:
        path: the file.
        words: read only the rows of these words (the others are not parsed); None: every row.
        dim: the number of values per row; None: that of the first row read.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a row read whose values are not ``dim`` numbers, or a file without any
            ``word v_1 ...`` line (each naming the file, and the line and word).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"word vectors file {path} does not exist")
    wanted = None if words is None else set(words)
    kept_words: list[str] = []
    rows: list[Tensor] = []  # a tensor per row: a fraction of the memory of Python floats
    lines_with_vectors = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.rstrip().split(" ")
            if len(parts) < 2:
                continue
            lines_with_vectors += 1
            word = parts[0]
            if wanted is not None and word not in wanted:
                continue
            if dim is None:
                dim = len(parts) - 1
            if len(parts) - 1 != dim:
                raise ValueError(f"{path}, line {number}: word {word!r} has {len(parts) - 1} values, expected {dim}")
            try:
                rows.append(torch.tensor([float(value) for value in parts[1:]], dtype=torch.float32))
            except ValueError:
                raise ValueError(f"{path}, line {number}: word {word!r}: not a row of numbers") from None
            kept_words.append(word)
    if not lines_with_vectors:
        raise ValueError(f"{path} holds no word vectors")
    vectors = torch.stack(rows) if rows else torch.zeros(0, dim or 0)
    return WordVectors(kept_words, vectors)


def load_glove(path: str | Path, words: Sequence[str], *, dim: int = 300) -> tuple[Tensor, int]:
    """Rows of the GloVe file for ``words``: a (len(words), dim) tensor and how many of
    ``words`` were found.

    Words absent from the file keep a row of zeros (as ban-vqa's ``create_embedding``);
    a word listed twice in the file gets its last row. Errors as :func:`read_glove`.
    """
    found = read_glove(path, words=words, dim=dim)
    position = {word: i for i, word in enumerate(words)}
    table = torch.zeros(len(words), dim)
    for word, row in zip(found.words, found.vectors, strict=True):
        table[position[word]] = row
    return table, len(set(found.words))
