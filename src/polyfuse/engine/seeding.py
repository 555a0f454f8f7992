"""Seeded determinism: one seed fixes initialisation, shuffling and dropout.

:func:`seed_everything` seeds Python, numpy and torch before the model is built.
:class:`ReseedEachEpoch` reseeds torch (dropout and any other draw of the global
generator) at the start of every training epoch from the seed and the epoch
number, so that an epoch does not depend on how the previous ones ran: a run
resumed from its last checkpoint continues exactly as the uninterrupted run.
The training order comes from the data module's sampler, seeded the same way.
"""

from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

__all__ = ["ReseedEachEpoch", "epoch_seed", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global generator that user code draws from
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 17) % 2**63


class ReseedEachEpoch(Callback):
    """Reseed the global generators at the start of each training epoch (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seed_everything(epoch_seed(self.seed, trainer.current_epoch))
