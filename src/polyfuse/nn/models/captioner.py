"""The video captioner of HOCA section 4.4: an encoder per modality and the caption decoder.

:class:`VideoCaptioner`: an encoder per modality (the paper's bidirectional LSTM,
section 3.1, :class:`~polyfuse.nn.bilstm.BiLSTMEncoder`; or ``tanh(linear)``; or none)
and the :class:`~polyfuse.nn.decoding.CaptionDecoder` (LSTM + MAF with the variant's
attention orders, exact or low-rank HOCA, or the mean-pooled baseline).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from polyfuse.nn.bilstm import BiLSTMEncoder
from polyfuse.nn.decoding import CaptionDecoder

__all__ = ["DROPOUT_PLACES", "ENCODERS", "VideoCaptioner"]

#: the per-modality encoders of :class:`VideoCaptioner`
ENCODERS = ("bilstm", "linear")
#: where :class:`VideoCaptioner` applies its dropout
DROPOUT_PLACES = ("encoder+decoder", "decoder")


class VideoCaptioner(nn.Module):
    """Per-modality encoders and the caption decoder.

    Args:
        input_dims: raw feature size d_i per modality.
        vocab_size: V.
        orders: MAF orders (``"UBT"`` ...) or None for the mean-pooled baseline.
        low_rank: Low-Rank HOCA instead of HOCA.
        max_lengths: the longest sequence per modality (sizes exact HOCA's weights).
        feature_dim: the encoder's size (``bilstm``: hidden size per direction, the output
            has ``2 * feature_dim`` features; ``linear``: the output size), or None to
            feed the raw features.
        encoder: ``"bilstm"`` (HOCA section 3.1: a bidirectional LSTM per modality over
            its real steps, both directions concatenated) or ``"linear"``
            (``tanh(linear)`` per step, a lighter encoder: the ablation of docs/RESULTS.md).
        embed_dim, hidden_dim, attention_dim, rank, combination, dropout: see
            :class:`~polyfuse.nn.decoding.CaptionDecoder`.
        dropout_at: where ``dropout`` applies: ``"encoder+decoder"`` (each encoder's
            output, and the decoder LSTM's input and output) or ``"decoder"`` (the decoder
            LSTM's input and output only: HOCA section 5.2, "The dropout rate for the input
            and output of LSTM decoder is 0.5"). Without an encoder (``feature_dim``
            None) the two are the same.
    """

    def __init__(
        self, input_dims: Sequence[int], vocab_size: int, *, orders: str | None, low_rank: bool,
        max_lengths: Sequence[int], feature_dim: int | None = 128, embed_dim: int = 128,
        hidden_dim: int = 256, attention_dim: int = 64, rank: int = 1, combination: str = "log",
        dropout: float = 0.5, encoder: str = "bilstm", dropout_at: str = "encoder+decoder",
    ) -> None:
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"VideoCaptioner: unknown encoder {encoder!r}; expected one of {', '.join(ENCODERS)}")
        if dropout_at not in DROPOUT_PLACES:
            raise ValueError(f"VideoCaptioner: unknown dropout_at {dropout_at!r}; expected one of {', '.join(DROPOUT_PLACES)}")
        self.encoder = encoder if feature_dim is not None else "none"
        self.dropout_at = dropout_at
        encoder_dropout = dropout if dropout_at == "encoder+decoder" else 0.0
        self.encoders: nn.ModuleList
        if feature_dim is None:
            self.encoders = nn.ModuleList(nn.Identity() for _ in input_dims)
            dims = list(input_dims)
        elif encoder == "bilstm":
            self.encoders = nn.ModuleList(BiLSTMEncoder(int(d), feature_dim, dropout=encoder_dropout) for d in input_dims)
            dims = [2 * feature_dim] * len(input_dims)
        else:
            self.encoders = nn.ModuleList(
                nn.Sequential(nn.Linear(int(d), feature_dim), nn.Tanh(), nn.Dropout(encoder_dropout)) for d in input_dims
            )
            dims = [feature_dim] * len(input_dims)
        self.decoder = CaptionDecoder(
            dims, vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, orders=orders,
            low_rank=low_rank, attention_dim=attention_dim, rank=rank, max_lengths=list(max_lengths),
            combination=combination, dropout=dropout,
        )

    def encode(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> list[Tensor]:
        """Encoded modalities (B, T_i, d'), zero at padded steps."""
        if self.encoder == "bilstm":
            return [enc(x, m.bool()) for enc, x, m in zip(self.encoders, inputs, masks, strict=True)]
        return [enc(x) * m.unsqueeze(-1) for enc, x, m in zip(self.encoders, inputs, masks, strict=True)]

    def forward(self, captions: Tensor, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
        """Teacher-forced logits (B, L - 1, V)."""
        return self.decoder(captions, self.encode(inputs, masks), masks)
