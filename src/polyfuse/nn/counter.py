"""The counting module of Zhang, Hare and Prügel-Bennett (ICLR 2018) as a module.

It owns the weights of the eight piecewise linear functions f_1..f_8 and calls
:func:`polyfuse.functional.counting.count_features`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from polyfuse.functional.counting import NUM_FUNCTIONS, count_features

__all__ = ["Counter"]


class Counter(nn.Module):
    """Count features of the ``objects`` most attended boxes: (B, M, 4), (B, M) -> (B, objects + 1).

    Args:
        objects: K, the number of boxes kept (BAN's reference uses 10).
        pieces: n, the pieces of each piecewise linear function (16 in the paper).
        already_sigmoided: the attention given is already in [0, 1].

    ``weight`` is (8, n + 1); each row starts as ``[0, 1, ..., 1]``, which makes
    every f_k the identity on [0, 1] (section 3.5 of the paper).
    """

    def __init__(self, objects: int = 10, *, pieces: int = 16, already_sigmoided: bool = False) -> None:
        super().__init__()
        for name, value in [("objects", objects), ("pieces", pieces)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Counter: {name} must be a positive integer, got {value!r}")
        self.objects = objects
        self.pieces = pieces
        self.already_sigmoided = bool(already_sigmoided)
        weight = torch.ones(NUM_FUNCTIONS, pieces + 1)
        weight[:, 0] = 0.0  # f_k(0) = 0
        self.weight = nn.Parameter(weight)

    def forward(self, boxes: Tensor, attention: Tensor) -> Tensor:
        """``boxes`` (B, M, 4) as (x1, y1, x2, y2), ``attention`` (B, M) logits -> (B, objects + 1)."""
        return count_features(
            boxes,
            attention,
            self.weight,
            objects=self.objects,
            already_sigmoided=self.already_sigmoided,
        )

    def extra_repr(self) -> str:
        return f"objects={self.objects}, pieces={self.pieces}, already_sigmoided={self.already_sigmoided}"
