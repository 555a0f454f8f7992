"""Question encoder of BAN's VQA model: word embeddings and a one-layer GRU.

Legend for shapes: ``B`` batch, ``L`` words per question, ``V`` words of the
vocabulary, ``E`` embedding size (300), ``E2`` size of an optional second embedding
(300 in ban-vqa's ``--op c``), ``H`` GRU hidden size (1024 in BAN).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["QuestionEncoder"]


class QuestionEncoder(nn.Module):
    """Word indices (B, L) -> GRU outputs (B, L, H), BAN's question sequence X^T.

    The embedding has ``V + 1`` rows, the last (index V) being padding with a zero
    vector, as ban-vqa's ``WordEmbedding``; the GRU starts from a zero state.

    With ``second_embedding_dim`` set, a second embedding of the same ``V + 1`` rows
    (padding index V) is concatenated after the first, so the GRU reads ``E + E2``
    features per word: ban-vqa's ``WordEmbedding`` with ``op='c'`` (its default, the
    paper's BAN-Glove-Counter: ``cat(emb(x), emb_(x))``). Without it the state dict is
    the same as before the option existed.

    Args:
        num_words: V.
        embedding_dim: E.
        hidden_dim: H.
        word_vectors: None (random initialisation) or (V, E) initial rows, e.g. from
            :func:`polyfuse.data.formats.glove.load_glove`; with ``second_embedding_dim
            == E`` the second embedding starts from them too (ban-vqa without tf-idf).
        second_embedding_dim: None (one embedding) or E2.
    """

    def __init__(
        self,
        num_words: int,
        *,
        embedding_dim: int = 300,
        hidden_dim: int = 1024,
        word_vectors: Tensor | None = None,
        second_embedding_dim: int | None = None,
    ) -> None:
        super().__init__()
        sizes = [("num_words", num_words), ("embedding_dim", embedding_dim), ("hidden_dim", hidden_dim)]
        if second_embedding_dim is not None:
            sizes.append(("second_embedding_dim", second_embedding_dim))
        for name, value in sizes:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"QuestionEncoder: {name} must be a positive integer, got {value!r}")
        self.num_words = num_words
        self.embedding = nn.Embedding(num_words + 1, embedding_dim, padding_idx=num_words)
        if word_vectors is not None:
            if tuple(word_vectors.shape) != (num_words, embedding_dim):
                raise ValueError(
                    f"QuestionEncoder: word_vectors has shape {tuple(word_vectors.shape)}, "
                    f"expected ({num_words}, {embedding_dim})"
                )
            self.embedding.weight.data[:num_words] = word_vectors
        self.second_embedding = None
        if second_embedding_dim is not None:
            self.second_embedding = nn.Embedding(num_words + 1, second_embedding_dim, padding_idx=num_words)
            if word_vectors is not None and second_embedding_dim == embedding_dim:
                self.second_embedding.weight.data[:num_words] = word_vectors
        gru_inputs = embedding_dim + (second_embedding_dim or 0)
        self.gru = nn.GRU(gru_inputs, hidden_dim, num_layers=1, batch_first=True)

    @property
    def hidden_dim(self) -> int:
        return self.gru.hidden_size

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"QuestionEncoder: tokens must be a (B, L) long tensor, got {tuple(tokens.shape)} {tokens.dtype}")
        if bool((tokens < 0).any()) or bool((tokens > self.num_words).any()):
            raise ValueError(f"QuestionEncoder: word indices must lie in [0, {self.num_words}]")
        words = self.embedding(tokens)  # (B, L, E)
        if self.second_embedding is not None:  # ban-vqa's op 'c': (B, L, E + E2)
            words = torch.cat([words, self.second_embedding(tokens)], dim=-1)
        output, _ = self.gru(words)
        return output

