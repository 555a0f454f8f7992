"""The Non-Transformer setting of MAN (MAN appendix H.1): LMF's model plus an extra fusion module.

LMF (Liu et al., ACL 2018, Section 3 and its public code) encodes each modality
into one vector and fuses the vectors with the low-rank tensor fusion:

- text: an LSTM over the real steps; its final hidden state, dropout, then a
  Linear to ``text_out`` features (LMF's text subnetwork);
- every other modality: the mean of its real steps, then BatchNorm, dropout and
  three Linear + ReLU layers of ``hidden`` features (LMF's audio / video subnetwork);
- the fusion ``h = sum_r w_r prod_j ([z_j, 1] W_j^(r)) + b``
  (:func:`polyfuse.functional.tensor_fusion.low_rank_fusion`, LMF Eq. 6) to ``out``
  features.

The extra module (any registered fusion module; MAN in the paper) fuses the
encoded *sequences*, which LMF's pooling throws away: the text LSTM's output at
every step and, per step, a Linear + ReLU of each other modality. Its (B, F)
representation is concatenated to LMF's (B, out), as MAN appendix H.2 states for
the Non-Transformer setting; the task head reads the concatenation.

In contextual mode (a window of utterances around the sample) the ``centre``
step replaces the pooled vector: the LSTM's output at the sample's own utterance
(having read the utterances before it) and the sample's own audio / video step.

Shapes: ``B`` batch, ``T_j`` steps, ``d_j`` features of modality j.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from polyfuse.functional.tensor_fusion import low_rank_fusion
from polyfuse.nn.backbones.common import (
    ExtraFactory,
    check_backbone_inputs,
    extra_module_inputs,
    pool_steps,
)
from polyfuse.nn.backbones.registry import register

__all__ = ["LSTMLMF"]


def _subnetwork(input_dim: int, hidden: int, dropout: float) -> nn.Sequential:
    """LMF's audio / video subnetwork on a pooled vector: (B, d) -> (B, hidden)."""
    return nn.Sequential(
        nn.BatchNorm1d(input_dim), nn.Dropout(dropout),
        nn.Linear(input_dim, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
    )


@register("lstm_lmf")
class LSTMLMF(nn.Module):
    """LMF's encoders and low-rank fusion with an optional extra module (module docstring).

    Args:
        input_dims: d_j per modality (m >= 2).
        extra: None, or a callable ``input_dims -> fusion module`` over the encoded sequences.
        text: index of the modality the LSTM reads (default 0).
        text_hidden: LSTM size.
        text_out: size of the text vector.
        hidden: size of every other modality's vector (one int, or one per
            modality, the text entry ignored).
        out: LMF's fusion output size.
        rank: LMF's rank R.
        dropout: dropout of the subnetworks.
        modality_names: for messages.

    ``forward(inputs, masks, centre=None) -> (B, out + F)``.
    """

    takes_centre = True

    def __init__(
        self,
        input_dims: Sequence[int],
        *,
        extra: ExtraFactory | None = None,
        text: int = 0,
        text_hidden: int = 64,
        text_out: int = 32,
        hidden: int | Sequence[int] = 16,
        out: int = 32,
        rank: int = 4,
        dropout: float = 0.2,
        modality_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.input_dims = [int(d) for d in input_dims]
        count = len(self.input_dims)
        if count < 2:
            raise ValueError(f"LSTMLMF needs at least 2 modalities, got input_dims={self.input_dims}")
        if not 0 <= text < count:
            raise ValueError(f"LSTMLMF: text={text} is not a modality index (0..{count - 1})")
        hiddens = [int(hidden)] * count if isinstance(hidden, int) else [int(h) for h in hidden]
        if len(hiddens) != count or min(hiddens) < 1 or min(text_hidden, text_out, out, rank) < 1:
            raise ValueError(f"LSTMLMF: sizes must be positive (hidden={hidden}, one per modality or one int)")
        self.modality_names = list(modality_names or [f"m{j}" for j in range(count)])
        self.text = int(text)
        self.lstm = nn.LSTM(self.input_dims[text], text_hidden, batch_first=True)
        self.text_dropout = nn.Dropout(dropout)
        self.text_out = nn.Linear(text_hidden, text_out)
        self.subnetworks = nn.ModuleDict({
            str(j): _subnetwork(d, hiddens[j], dropout) for j, d in enumerate(self.input_dims) if j != text
        })
        self.vector_dims = [text_out if j == text else hiddens[j] for j in range(count)]
        self.rank, self.fusion_dim = int(rank), int(out)
        self.factors = nn.ParameterList(nn.Parameter(torch.empty(rank, h + 1, out)) for h in self.vector_dims)
        self.rank_weights = nn.Parameter(torch.empty(rank))
        self.bias = nn.Parameter(torch.zeros(out))
        for h, factor in zip(self.vector_dims, self.factors, strict=True):
            nn.init.normal_(factor, std=math.sqrt(2.0 / (h + 1 + out)))
        nn.init.normal_(self.rank_weights, std=math.sqrt(2.0 / (1 + rank)))
        # per-step encoders of the non-text modalities, for the extra module
        self.step_encoders = nn.ModuleDict({
            str(j): nn.Sequential(nn.Linear(d, hiddens[j]), nn.ReLU())
            for j, d in enumerate(self.input_dims) if j != text
        })
        sequence_dims = [text_hidden if j == text else hiddens[j] for j in range(count)]
        self.extra = extra(sequence_dims) if extra is not None else None
        self.out_dim = self.fusion_dim + (int(self.extra.out_dim) if self.extra is not None else 0)

    def _text(self, x: Tensor, mask: Tensor, centre: Tensor | None) -> tuple[Tensor, Tensor]:
        """LSTM outputs (B, T, text_hidden), zero at padded steps, and the text vector."""
        lengths = mask.sum(dim=1)
        if not torch.equal(mask, torch.arange(x.shape[1], device=x.device) < lengths[:, None]):
            raise ValueError(
                f"LSTMLMF: the text modality ({self.modality_names[self.text]}) must be padded at the end "
                "(real steps first); read left-padded files with data.padding: left"
            )
        packed = pack_padded_sequence(x, lengths.clamp_min(1).cpu(), batch_first=True, enforce_sorted=False)
        output, (final, _) = self.lstm(packed)
        steps, _ = pad_packed_sequence(output, batch_first=True, total_length=x.shape[1])
        steps = steps * mask.unsqueeze(-1)
        if centre is not None:
            state = pool_steps(steps, mask, centre, "last")
        else:
            state = torch.where(mask.any(dim=1, keepdim=True), final[-1], torch.zeros_like(final[-1]))
        return steps, self.text_out(self.text_dropout(state))

    def forward(self, inputs: Sequence[Tensor], masks: Sequence[Tensor] | None = None,
                centre: Tensor | None = None) -> Tensor:
        inputs, masks = check_backbone_inputs(inputs, masks, self.input_dims, "LSTMLMF")
        vectors, sequences = [], []
        for j, (x, mask) in enumerate(zip(inputs, masks, strict=True)):
            if j == self.text:
                steps, vector = self._text(x, mask, centre)
            else:
                vector = self.subnetworks[str(j)](pool_steps(x, mask, centre, "mean"))
                steps = self.step_encoders[str(j)](x) * mask.unsqueeze(-1)
            vectors.append(vector)
            sequences.append(steps)
        parts = [low_rank_fusion(vectors, list(self.factors), self.rank_weights, bias=self.bias)]  # LMF Eq. 6
        if self.extra is not None:
            parts.append(self.extra(*extra_module_inputs(sequences, masks)))
        return torch.cat(parts, dim=-1)
