"""The modality subnetworks of TFN and LMF: what turns one modality's sequence into
the vector z_j that the fusion layer multiplies.

Legend for shapes: ``B`` batch, ``T`` length, ``d`` input feature size, ``H`` the
LSTM's hidden size, ``h`` the size of the output vector z_j.

Two kinds, after the papers:

- :class:`PooledSubnetwork` — the mean over the real steps, then ``layers``
  Linear + ReLU layers of width h. TFN's acoustic and visual embedding
  subnetworks (section 3.1 of Zadeh et al., EMNLP 2017: features averaged over
  the frames, then three hidden layers of 32 ReLU units) with ``layers=3``; LMF's
  audio and video subnetworks (Liu et al., ACL 2018: a 2-layer fully connected
  network) with ``layers=2``; ``layers=0`` is the mean alone.
- :class:`SequenceSubnetwork` — an LSTM over the real steps, in order, whose
  hidden state after the last real step goes through a head. TFN's spoken
  language embedding subnetwork (an LSTM of 128 units followed by two fully
  connected layers of 128 ReLU units) with ``layers=2, activation=True``; LMF's
  text subnetwork (an LSTM followed by a linear layer, as in the authors' code)
  with ``layers=1, activation=False``.

TFN feeds its fully connected layers with the LSTM outputs of all the words of a
fixed 20-word window; here sequences have any length and padding, so the head reads
the state after the last real step (as the LMF authors' text subnetwork does).

Under ``torch.compile`` the LSTMs run eagerly (:func:`lstm_outputs`, one graph break
for all of a module's LSTMs), as one fused kernel (cuDNN on CUDA, oneDNN on the CPU).
Traced into the graph (dynamo's ``allow_rnn``) an LSTM is unrolled into one cell per
step: compiled TFN and LMF were then slower than eager (0.45x and 0.43x forward+backward
on an H100, docs/BENCHMARKS.md, "torch.compile"), and the LSTM alone is on the CPU too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from polyfuse.functional.pooling import masked_mean

__all__ = ["PooledSubnetwork", "SequenceSubnetwork", "encode", "last_real_step", "lstm_outputs", "real_steps_first"]


def real_steps_first(x: Tensor, mask: Tensor) -> Tensor:
    """Move each sample's real steps to the front, keeping their order.

    Args:
        x: (B, T, d) sequence.
        mask: (B, T) bool, True at real steps (anywhere, not only a prefix).

    Returns:
        (B, T, d): row b holds the ``mask[b].sum()`` real steps of ``x[b]`` in their
        original order, then its padded steps.
    """
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # (B, T)
    return x.gather(1, order.unsqueeze(-1).expand_as(x))


def last_real_step(outputs: Tensor, mask: Tensor) -> Tensor:
    """(B, T, H) outputs over the real steps moved first, (B, T) mask -> (B, H): each
    sample's output at step ``mask[b].sum() - 1`` (step 0 for a sample without real steps)."""
    last = (mask.sum(dim=1) - 1).clamp_min(0)  # (B,) index of the last real step
    return outputs.gather(1, last.view(-1, 1, 1).expand(-1, 1, outputs.shape[-1])).squeeze(1)


def _linear_stack(in_dim: int, width: int, layers: int, *, activation: bool) -> nn.Sequential:
    """``layers`` Linear layers of width ``width`` (the first from ``in_dim``), each
    followed by a ReLU when ``activation``."""
    modules: list[nn.Module] = []
    for index in range(layers):
        modules.append(nn.Linear(in_dim if index == 0 else width, width))
        if activation:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class PooledSubnetwork(nn.Module):
    """Masked mean over the real steps, dropout, then ``layers`` Linear + ReLU.

    Args:
        input_dim: d.
        hidden_dim: h, the width of every layer (ignored, and h = d, when ``layers`` is 0).
        layers: number of Linear + ReLU layers (0: the mean alone).
        dropout: dropout probability on the pooled vector.

    Shapes:
        x: (B, T, d); mask: (B, T) bool. Output: (B, h).
    """

    def __init__(self, input_dim: int, hidden_dim: int, *, layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.output_dim = int(hidden_dim) if layers else int(input_dim)
        self.dropout = nn.Dropout(dropout)
        self.layers = _linear_stack(input_dim, hidden_dim, layers, activation=True)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        pooled = masked_mean(x, mask)  # (B, d)
        if self.training and self.dropout.p > 0:  # two module calls less for the identity
            pooled = self.dropout(pooled)
        return self.layers(pooled) if len(self.layers) else pooled  # (B, h)


class SequenceSubnetwork(nn.Module):
    """An LSTM over the real steps; its last real state, dropout, then a head.

    Args:
        input_dim: d.
        lstm_dim: H, the LSTM's hidden size.
        hidden_dim: h, the width of the head's layers.
        layers: number of Linear layers of the head (at least 1).
        activation: a ReLU after every layer of the head.
        dropout: dropout probability on the LSTM state.

    Shapes:
        x: (B, T, d); mask: (B, T) bool, real steps anywhere. Output: (B, h).
        A sample without any real step reads one zero step.
    """

    def __init__(
        self,
        input_dim: int,
        lstm_dim: int,
        hidden_dim: int,
        *,
        layers: int,
        activation: bool,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.output_dim = int(hidden_dim)
        self.lstm = nn.LSTM(input_dim, lstm_dim, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.head = _linear_stack(lstm_dim, hidden_dim, layers, activation=activation)

    def lstm_outputs(self, x: Tensor, mask: Tensor) -> Tensor:
        """(B, T, d), (B, T) -> (B, T, H): the LSTM's outputs over the real steps moved to
        the front (:func:`real_steps_first`); step ``length - 1`` holds the state after the
        last real step. Eager under ``torch.compile`` (see the module docstring)."""
        return lstm_outputs([self], [x], [mask])[0]

    def read(self, outputs: Tensor, mask: Tensor) -> Tensor:
        """(B, T, H) LSTM outputs from :meth:`lstm_outputs`, (B, T) -> (B, h): the state after
        each sample's last real step, through dropout and the head.

        The LSTM runs over the whole padded batch; being causal, its output at step
        ``length - 1`` is the state after the last real step, whatever follows. (A packed
        sequence gives the same state but needs the lengths on the host: a
        synchronisation, and a break in ``torch.compile``'s graph.)
        """
        return self.head(self.dropout(last_real_step(outputs, mask)))  # (B, H) -> (B, h)

    def last_state(self, x: Tensor, mask: Tensor) -> Tensor:
        """(B, T, d), (B, T) -> (B, H): the LSTM's hidden state after each sample's last real step."""
        return last_real_step(self.lstm_outputs(x, mask), mask)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.read(self.lstm_outputs(x, mask), mask)  # (B, T, d) -> (B, h)


@torch.compiler.disable
def lstm_outputs(subnetworks: Sequence[nn.Module], inputs: Sequence[Tensor], masks: Sequence[Tensor]
                 ) -> list[Tensor | None]:
    """Per modality j: the (B, T_j, H) outputs of ``subnetworks[j]``'s LSTM over the real
    steps moved to the front, if it is a :class:`SequenceSubnetwork`, else None.

    Always eager: ``torch.compile`` leaves this call out of its graph (one graph break
    for all the LSTMs of a module), so that each LSTM runs as one fused kernel.
    """
    return [
        net.lstm(real_steps_first(x, mask))[0] if isinstance(net, SequenceSubnetwork) else None
        for net, x, mask in zip(subnetworks, inputs, masks, strict=True)
    ]


def encode(subnetworks: Sequence[nn.Module], inputs: Sequence[Tensor], masks: Sequence[Tensor],
           outputs: Sequence[Tensor | None]) -> list[Tensor]:
    """z_j for every modality, m tensors (B, h_j): ``subnetworks[j]`` reading its LSTM
    ``outputs[j]`` (from :func:`lstm_outputs`), or pooling ``inputs[j]`` (None)."""
    return [
        net(x, mask) if output is None else net.read(output, mask)
        for net, x, mask, output in zip(subnetworks, inputs, masks, outputs, strict=True)
    ]
