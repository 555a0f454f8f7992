"""A bidirectional LSTM over one modality's real steps: the encoder of Low-Rank HOCA.

Reference: T. Jin, S. Huang, Y. Li, Z. Zhang. "Low-Rank HOCA: Efficient High-Order
Cross-Modal Attention for Video Captioning." EMNLP 2019, section 3.1: "The extracted
features are sent to Bi-LSTM ... capturing the information from both forward and
backward directions. The output of Bi-LSTM is kept." Section 5.2: "The hidden size
is 512 for all LSTMs." The paper does not say how the two directions are combined;
here the output at step t is their concatenation ``[h_t^fwd ; h_t^bwd]`` (PyTorch's
bidirectional output), so its size is twice the hidden size.

Shapes: ``B`` batch, ``T`` steps, ``d`` input size, ``H`` hidden size per direction.

Padded steps do not reach the real ones: the real steps are packed
(``pack_padded_sequence``), so the forward pass stops at each sample's last real step
and the backward pass starts there, as if each sample were run alone, unpadded.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from polyfuse.nn.modality_subnetworks import real_steps_first

__all__ = ["BiLSTMEncoder"]


class BiLSTMEncoder(nn.Module):
    """One-layer bidirectional LSTM over the real steps of a (B, T, d) sequence.

    Args:
        input_dim: d.
        hidden_dim: H, per direction (the paper: 512); the output has 2 H features.
        dropout: dropout on the output.

    ``forward(x (B, T, d), mask (B, T) bool) -> (B, T, 2 H)``: at real step t the
    concatenated forward and backward states; zero at padded steps. The real steps
    may lie anywhere (they are read in order); a sample without any is all zero.
    """

    def __init__(self, input_dim: int, hidden_dim: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        if input_dim <= 0 or hidden_dim <= 0:
            raise ValueError(f"BiLSTMEncoder: sizes must be positive, got input_dim={input_dim}, hidden_dim={hidden_dim}")
        self.lstm = nn.LSTM(int(input_dim), int(hidden_dim), batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)
        self.output_dim = 2 * int(hidden_dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        if x.dim() != 3 or mask.shape != x.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(
                f"BiLSTMEncoder: expected x (B, T, d) and a bool mask (B, T), got {tuple(x.shape)} "
                f"and {tuple(mask.shape)} ({mask.dtype})"
            )
        batch, steps = mask.shape
        if batch == 0 or steps == 0:
            return x.new_zeros(batch, steps, self.output_dim)
        order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # real steps first
        lengths = mask.sum(dim=1).clamp_min(1).cpu()  # a sample without real steps runs one (masked) step
        packed = pack_padded_sequence(real_steps_first(x, mask), lengths, batch_first=True, enforce_sorted=False)
        outputs, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=steps)
        # Back to the original positions: step i of the packed row was step order[b, i].
        placed = torch.zeros_like(outputs).scatter(1, order.unsqueeze(-1).expand_as(outputs), outputs)
        return self.dropout(placed) * mask.unsqueeze(-1)
