"""An LSTM caption decoder that attends to several modalities with MAF at every step.

Reference: T. Jin, S. Huang, Y. Li, Z. Zhang. "Low-Rank HOCA: Efficient High-Order
Cross-Modal Attention for Video Captioning." EMNLP 2019, section 4.4 and Fig. 3
(``HOCA Eq. k`` below).

Legend for shapes: ``B`` batch, ``n`` number of modalities, ``T_i`` length of
modality i, ``d_i`` its feature size, ``L`` caption length in tokens, ``V``
vocabulary size, ``H`` the LSTM's hidden size, ``E`` the word-embedding size.

One step (Fig. 3): the LSTM reads the embedding of the previous word and gives
h_t; :class:`~polyfuse.nn.maf.MAF` conditioned on h_t attends to every modality
(unary, binary, ... attentions combined by Eq. 19) and fuses their context vectors
(Eq. 20, 21, 23); the word distribution is
``p_t = softmax(W_p^h h_t + sum_k beta_t^k D_t(k) + b_p)`` (Eq. 22), so MAF's output
size is V. Training minimises the cross-entropy of the ground-truth words with
teacher forcing (Eq. 24).

``orders=None`` gives the mean-pooled baseline (no attention): every step sees the
same masked mean of each modality, ``sum_k W_p^k mean_t(x_k)`` in place of Eq. 22's
fused context (:class:`MeanPoolContext`).

What the paper leaves open, chosen here: the LSTM's initial state is
``tanh(linear(mean-pooled features))`` (h_0 and c_0 each from the concatenated
masked means of the modalities); the LSTM input is the previous word's embedding
only; dropout (default 0; the paper: 0.5) applies to the LSTM's input (the word
embedding) and to h_t before Eq. 22's state term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from polyfuse._checks import prepare_fusion_inputs
from polyfuse.functional.pooling import masked_mean
from polyfuse.nn.hoca import MaxLengths
from polyfuse.nn.maf import MAF, MAFOutput, Orders

__all__ = [
    "CaptionDecoder",
    "DecoderState",
    "DecoderStep",
    "MeanPoolContext",
    "caption_cross_entropy",
]


class DecoderState(NamedTuple):
    """The LSTM state between steps."""

    hidden: Tensor  #: (B, H), h_t
    cell: Tensor  #: (B, H), c_t


class DecoderStep(NamedTuple):
    """What :meth:`CaptionDecoder.step` returns."""

    logits: Tensor  #: (B, V), the argument of Eq. 22's softmax
    state: DecoderState  #: the new LSTM state
    attention: list[Tensor]  #: one (B, T_i) tensor per modality, Eq. 19
    modality_weights: Tensor  #: (B, n), beta_t of Eq. 20


class MeanPoolContext(nn.Module):
    """The mean-pooled baseline in place of MAF: no attention, the same context every step.

    ``fused = sum_k W_p^k mean_t(x_k)`` (the form of Eq. 22 and 23 with uniform
    attention over the real steps and beta_t^k = 1 for every modality). The
    attention it reports is that uniform attention, its modality weights 1 / n.
    """

    def __init__(self, input_dims: Sequence[int], out_dim: int) -> None:
        super().__init__()
        self.input_dims = [int(dim) for dim in input_dims]
        self.output_projections = nn.ModuleList(
            nn.Linear(dim, out_dim, bias=False) for dim in self.input_dims
        )

    def fuse_prepared(
        self, query: Tensor, sequences: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> MAFOutput:
        """Same interface as :meth:`polyfuse.nn.maf.MAF.fuse_prepared`; ``query`` is unused."""
        attention = [m.float() / m.sum(-1, keepdim=True).clamp_min(1) for m in masks]
        context = [masked_mean(x, m) for x, m in zip(sequences, masks, strict=True)]
        fused = sum(
            projection(c) for projection, c in zip(self.output_projections, context, strict=True)
        )
        count = len(sequences)
        weights = query.new_full((query.shape[0], count), 1.0 / count)
        return MAFOutput(fused, attention, context, weights)


class CaptionDecoder(nn.Module):
    """LSTM decoder with multiple attentive fusion over n modalities (HOCA section 4.4).

    Args:
        input_dims: feature size d_i of each modality (already encoded features).
        vocab_size: V, including the special tokens.
        embed_dim: E, word-embedding size.
        hidden_dim: H, LSTM hidden size (the query size of MAF).
        orders: MAF's attention orders, e.g. ``"UB"`` or ``"UBT"`` (see
            :func:`~polyfuse.nn.maf.parse_orders`); None: the mean-pooled baseline
            (:class:`MeanPoolContext`, no attention).
        low_rank: Low-Rank HOCA (L-HOCA-*) instead of exact HOCA.
        attention_dim, rank, max_lengths, combination: passed to
            :class:`~polyfuse.nn.maf.MAF` (``combination`` is the form of Eq. 19).
        dropout: dropout on the word embedding (LSTM input) and on h_t before the
            output layer.
        padding_index: token id of padding (its embedding stays zero).

    ``forward(captions (B, L), inputs [(B, T_i, d_i)], masks)`` gives the teacher-forced
    logits (B, L - 1, V) of tokens 1..L-1 from tokens 0..L-2; :meth:`step` runs one
    step and :meth:`greedy` decodes.
    """

    def __init__(
        self,
        input_dims: Sequence[int],
        vocab_size: int,
        *,
        embed_dim: int = 128,
        hidden_dim: int = 256,
        orders: Orders | None = "UB",
        low_rank: bool = False,
        attention_dim: int = 64,
        rank: int = 1,
        max_lengths: MaxLengths = None,
        combination: str = "log",
        dropout: float = 0.0,
        padding_index: int = 0,
    ) -> None:
        super().__init__()
        self.input_dims = [int(dim) for dim in input_dims]
        if vocab_size < 2 or embed_dim <= 0 or hidden_dim <= 0:
            raise ValueError(
                f"CaptionDecoder: vocab_size must be >= 2 and sizes positive, got "
                f"vocab_size={vocab_size}, embed_dim={embed_dim}, hidden_dim={hidden_dim}"
            )
        if not 0 <= padding_index < vocab_size:
            raise ValueError(
                f"CaptionDecoder: padding_index {padding_index} is not a token id in "
                f"[0, {vocab_size - 1}]"
            )
        self.vocab_size, self.hidden_dim = int(vocab_size), int(hidden_dim)
        self.padding_index = int(padding_index)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_index)
        self.initial_hidden = nn.Linear(sum(self.input_dims), hidden_dim)
        self.initial_cell = nn.Linear(sum(self.input_dims), hidden_dim)
        self.lstm = nn.LSTMCell(embed_dim, hidden_dim)
        self.maf: MAF | MeanPoolContext
        if orders is None:
            self.maf = MeanPoolContext(self.input_dims, vocab_size)
        else:
            self.maf = MAF(
                self.input_dims,
                hidden_dim,
                vocab_size,
                orders=orders,
                low_rank=low_rank,
                attention_dim=attention_dim,
                rank=rank,
                max_lengths=max_lengths,
                combination=combination,
            )  # Eq. 18 to 21 and 23; its output is sum_k beta_t^k D_t(k) of Eq. 22
        self.state_output = nn.Linear(hidden_dim, vocab_size)  # W_p^h and b_p of Eq. 22
        self.dropout = nn.Dropout(dropout)

    # -- inputs -------------------------------------------------------------

    def prepare(
        self, inputs: Sequence[Tensor], masks: Sequence[Tensor | None] | None = None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Validate the modalities once per caption batch: zeroed padding, bool masks."""
        return prepare_fusion_inputs(inputs, masks, self.input_dims, "CaptionDecoder")

    def initial_state(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> DecoderState:
        """h_0 and c_0 from the masked means of prepared inputs."""
        pooled = torch.cat([masked_mean(x, m) for x, m in zip(inputs, masks, strict=True)], -1)
        return DecoderState(
            torch.tanh(self.initial_hidden(pooled)), torch.tanh(self.initial_cell(pooled))
        )

    def _check_tokens(self, tokens: Tensor, batch: int, what: str) -> None:
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
            raise ValueError(f"CaptionDecoder: {what} must be a LongTensor of token ids")
        if tokens.shape[0] != batch:
            raise ValueError(
                f"CaptionDecoder: {what} has batch size {tokens.shape[0]}, the features {batch}"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"CaptionDecoder: {what} holds token ids outside [0, {self.vocab_size - 1}] "
                f"(min {int(tokens.min())}, max {int(tokens.max())})"
            )

    def banned_ids(self, begin_index: int, end_index: int, banned_tokens: Sequence[int] = ()) -> list[int]:
        """The ids never generated: padding, begin and ``banned_tokens`` (checked: token
        ids other than the end token)."""
        extra = [int(t) for t in banned_tokens]
        for token in extra:
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"CaptionDecoder: banned token {token} is not a token id in [0, {self.vocab_size - 1}]"
                )
            if token == end_index:
                raise ValueError("CaptionDecoder: the end token cannot be banned (no caption could end)")
        return sorted({self.padding_index, int(begin_index), *extra})

    # -- one step -----------------------------------------------------------

    def step(
        self,
        words: Tensor,
        state: DecoderState,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor],
    ) -> DecoderStep:
        """One decoding step for prepared inputs (see :meth:`prepare`).

        Args:
            words: (B,) ids of the previous words y_{t-1}.
            state: the LSTM state after step t - 1.
            inputs, masks: prepared modalities (B, T_i, d_i) and (B, T_i) bool masks.
        """
        # h_t, Fig. 3; dropout on the LSTM's input and output (HOCA section 5.2)
        hidden, cell = self.lstm(self.dropout(self.embedding(words)), tuple(state))
        fusion = self.maf.fuse_prepared(hidden, inputs, masks)  # Eq. 18 to 23
        logits = self.state_output(self.dropout(hidden)) + fusion.fused  # Eq. 22
        return DecoderStep(
            logits, DecoderState(hidden, cell), fusion.attention, fusion.modality_weights
        )

    # -- whole captions -----------------------------------------------------

    def forward(
        self,
        captions: Tensor,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None = None,
    ) -> Tensor:
        """Teacher forcing: logits (B, L - 1, V) of captions[:, 1:] given captions[:, :-1].

        Args:
            captions: (B, L) token ids starting with the begin token, padded with
                ``padding_index``.
            inputs: n tensors (B, T_i, d_i); masks: None or (B, T_i) bool per modality.
        """
        sequences, full_masks = self.prepare(inputs, masks)
        self._check_tokens(captions, sequences[0].shape[0], "captions")
        if captions.dim() != 2 or captions.shape[1] < 2:
            raise ValueError(
                f"CaptionDecoder: captions has shape {tuple(captions.shape)}; expected (B, L) "
                "with L >= 2 (a begin token and at least one word)"
            )
        state = self.initial_state(sequences, full_masks)
        logits = []
        for t in range(captions.shape[1] - 1):
            output = self.step(captions[:, t], state, sequences, full_masks)
            logits.append(output.logits)
            state = output.state
        return torch.stack(logits, dim=1)

    @torch.no_grad()
    def greedy(
        self,
        inputs: Sequence[Tensor],
        masks: Sequence[Tensor | None] | None = None,
        *,
        begin_index: int,
        end_index: int,
        max_length: int = 20,
        banned_tokens: Sequence[int] = (),
    ) -> tuple[Tensor, list[DecoderStep]]:
        """Greedy decoding: the most probable word at every step (never padding or begin).

        ``banned_tokens``: further ids never generated (e.g. ``<unk>``).

        Returns:
            ``(tokens, steps)``: (B, S) generated ids, S <= max_length, with
            ``padding_index`` after a sample's end token (the end token itself is
            kept); and the S :class:`DecoderStep` records (attention per step).
        """
        if max_length < 1:
            raise ValueError(f"CaptionDecoder: max_length must be >= 1, got {max_length}")
        for name, index in (("begin_index", begin_index), ("end_index", end_index)):
            if not 0 <= index < self.vocab_size:
                raise ValueError(f"CaptionDecoder: {name} {index} is not a token id")
        banned_ids = self.banned_ids(begin_index, end_index, banned_tokens)
        sequences, full_masks = self.prepare(inputs, masks)
        batch = sequences[0].shape[0]
        state = self.initial_state(sequences, full_masks)
        words = torch.full((batch,), begin_index, dtype=torch.long, device=sequences[0].device)
        finished = torch.zeros(batch, dtype=torch.bool, device=words.device)
        banned = torch.tensor(banned_ids, device=words.device)
        tokens, steps = [], []
        for _ in range(max_length):
            output = self.step(words, state, sequences, full_masks)
            # The padding, begin and banned tokens are never generated.
            words = output.logits.index_fill(-1, banned, float("-inf")).argmax(dim=-1)
            tokens.append(words.masked_fill(finished, self.padding_index))
            steps.append(output)
            state = output.state
            finished = finished | (words == end_index)
            if bool(finished.all()):
                break
        return torch.stack(tokens, dim=1), steps


def caption_cross_entropy(
    logits: Tensor, targets: Tensor, padding_index: int = 0, label_smoothing: float = 0.0
) -> Tensor:
    """HOCA Eq. 24 per token: mean of -log p_t(y*_t) over the non-padding targets.

    Args:
        logits: (B, S, V) from :meth:`CaptionDecoder.forward`.
        targets: (B, S) token ids (the captions without their begin token).
        label_smoothing: in [0, 1): the target puts ``1 - eps`` on the true word
            and ``eps / V`` on every word (not in the paper, an option).
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"caption_cross_entropy: label_smoothing must lie in [0, 1), got {label_smoothing}")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"caption_cross_entropy: logits {tuple(logits.shape)} and targets "
            f"{tuple(targets.shape)} must be (B, S, V) and (B, S)"
        )
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=padding_index,
        label_smoothing=label_smoothing,
    )
