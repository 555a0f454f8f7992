"""BAN for phrase grounding (Flickr30k Entities, BAN section 5.1-5.3 and Table 4), as
ban-vqa's ``BanModel_flickr``: the caption's words through BAN's question encoder (word
embedding and GRU, every time step kept), the GRU states at the phrases' positions, and
the logits of the bilinear attention map between the regions and those states. The
logit of (phrase p, box o) is the box's score for the phrase, trained with binary
cross-entropy (:func:`polyfuse.tasks.grounding.spec.grounding_loss`).

The phrase position is the caption's *last* word of the phrase: "We mark the token
positions which are at the end of each annotated phrase" (BAN section 5.2); ban-vqa's
``utils.find_sublist`` returns "the index of the last token". The GRU reads left to
right, so the state there has read the whole phrase. ban-vqa gathers the GRU states at
the positions before the attention (``batched_index_select`` in ``BanModel_flickr``);
a logit depends on its own word and box only, so this equals the logits of all words
taken at the positions (:func:`polyfuse.metrics.grounding.phrase_scores` of
:meth:`BanGrounding.word_logits`; tests/tasks/grounding check it). With G > 1 glimpses
(ban-vqa uses G = 1 for Flickr30k: ``main.py`` sets ``args.gamma = 1``) a phrase's
scores are the sum of its logits over the glimpses, as ``phrase_scores`` sums them.

Legend for shapes: ``B`` captions, ``L`` words, ``P`` phrases, ``O`` boxes, ``d_v``
region feature size, ``H`` the GRU size, ``G`` glimpses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations

from polyfuse._checks import check_dropout
from polyfuse.functional.bilinear import bilinear_attention_logits, bilinear_attention_map
from polyfuse.nn.ban import weight_normed_linear
from polyfuse.nn.models.vqa import image_mask
from polyfuse.nn.text import QuestionEncoder

__all__ = ["BanGrounding", "select_positions"]


def select_positions(states: Tensor, positions: Tensor) -> Tensor:
    """The rows of ``states`` (B, L, H) at ``positions`` (B, P) long: (B, P, H)
    (ban-vqa's ``utils.batched_index_select``)."""
    if states.dim() != 3 or positions.dim() != 2 or positions.shape[0] != states.shape[0]:
        raise ValueError(f"select_positions: states (B, L, H) and positions (B, P), got {tuple(states.shape)} "
                         f"and {tuple(positions.shape)}")
    if positions.numel() and (positions.min() < 0 or positions.max() >= states.shape[1]):
        raise ValueError(f"select_positions: positions lie outside [0, {states.shape[1]})")
    return states.gather(1, positions.unsqueeze(-1).expand(-1, -1, states.shape[-1]))


class BanGrounding(nn.Module):
    """Box scores of a caption's phrases from BAN's bilinear attention logits.

    ``forward(tokens, image, positions, phrase_mask)``: tokens (B, L) long, image
    (B, O, d_v) (all-zero rows: padded boxes), positions (B, P) long (each phrase's last
    word), phrase_mask (B, P) bool -> scores (B, P, O) float, -inf at padded boxes and
    phrases.

    Args:
        num_words: the vocabulary size V (the embedding has V + 1 rows, the last padding).
        image_dim: d_v.
        hidden_dim: H, the GRU's size; the attention rank is K' = k H (ban-vqa's
            ``BiAttention(v_dim, num_hid, num_hid, gamma)`` with ``BCNet(k=3)``).
        glimpses: G (ban-vqa: 1 for Flickr30k).
        k, attention_rank: K' = k H, or K' set directly.
        embedding_dim: the word embedding size (300, GloVe's).
        word_vectors: None or (V, embedding_dim) initial rows.
        dropout: dropout before the attention's linear maps (ban-vqa's ``FCNet``: 0.2).
        attention_dropout: dropout on relu(U^T x) (ban-vqa's ``BCNet``: 0.5).
    """

    def __init__(self, num_words: int, image_dim: int, *, hidden_dim: int = 1280, glimpses: int = 1, k: int = 3,
                 attention_rank: int | None = None, embedding_dim: int = 300, word_vectors: Tensor | None = None,
                 dropout: float = 0.2, attention_dropout: float = 0.5) -> None:
        super().__init__()
        rank = int(attention_rank) if attention_rank is not None else int(k) * int(hidden_dim)
        for name, value in (("image_dim", image_dim), ("glimpses", glimpses), ("attention_rank", rank)):
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"BanGrounding: {name} must be a positive integer, got {value!r}")
        self.image_dim, self.glimpses = int(image_dim), int(glimpses)
        self.dropout = check_dropout(dropout, "BanGrounding")
        self.attention_dropout = check_dropout(attention_dropout, "BanGrounding", "attention_dropout")
        self.question = QuestionEncoder(num_words, embedding_dim=embedding_dim, hidden_dim=hidden_dim,
                                        word_vectors=word_vectors)
        # U, V and the p_g of BAN Eq. 10, 13 (ban-vqa's BCNet v_net, q_net, h_mat), the
        # per-glimpse constant h_bias: it does not cancel here, the logits are the scores.
        self.attention_x = weight_normed_linear(self.image_dim, rank)
        self.attention_y = weight_normed_linear(hidden_dim, rank)
        glimpse_vectors = nn.Linear(rank, self.glimpses, bias=False)
        nn.init.normal_(glimpse_vectors.weight)  # ban-vqa draws h_mat from N(0, 1)
        self.attention_glimpses = parametrizations.weight_norm(glimpse_vectors, dim=None)
        self.attention_bias = nn.Parameter(torch.randn(self.glimpses))  # h_bias ~ N(0, 1)

    def _drop(self, tensor: Tensor) -> Tensor:
        return F.dropout(tensor, self.dropout, self.training) if self.dropout > 0 else tensor

    def _logits(self, image: Tensor, words: Tensor, words_mask: Tensor | None) -> Tensor:
        if image.dim() != 3 or image.shape[-1] != self.image_dim:
            raise ValueError(f"BanGrounding: image must have shape (B, O, {self.image_dim}), got {tuple(image.shape)}")
        return bilinear_attention_logits(  # (B, G, O, T), BAN Eq. 10, 13
            self._drop(image), self._drop(words),
            self.attention_x.weight, self.attention_y.weight, self.attention_glimpses.weight,
            x_bias=self.attention_x.bias, y_bias=self.attention_y.bias, glimpse_bias=self.attention_bias,
            x_mask=image_mask(image), y_mask=words_mask,
            dropout=self.attention_dropout, training=self.training,
        )  # fmt: skip

    def word_logits(self, tokens: Tensor, image: Tensor) -> Tensor:
        """The attention logits of every (box, word) pair, (B, G, O, L); -inf at padded boxes."""
        return self._logits(image, self.question(tokens), None)

    def attention(self, tokens: Tensor, image: Tensor) -> Tensor:
        """BAN's attention maps (softmax over each whole O x L map, Eq. 8), (B, G, O, L)."""
        return bilinear_attention_map(self.word_logits(tokens, image))

    def forward(self, tokens: Tensor, image: Tensor, positions: Tensor, phrase_mask: Tensor) -> Tensor:
        phrases = select_positions(self.question(tokens), positions)  # (B, P, H)
        logits = self._logits(image, phrases, phrase_mask)  # (B, G, O, P)
        return logits.sum(dim=1).transpose(1, 2)  # (B, P, O): summed over glimpses
