"""Seeded determinism: one seed fixes initialisation, shuffling and dropout.

:func:`seed_everything` seeds Python, numpy and torch before the model is built.
:class:`ReseedEachEpoch` reseeds torch (dropout and any other draw of the global
generator) at the start of every training epoch from the seed and the epoch
number, so that an epoch does not depend on how the previous ones ran: a run
resumed from its last checkpoint continues exactly as the uninterrupted run.
The training order comes from the data module's sampler, seeded the same way.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from polyfuse.seeds import epoch_seed, seed_everything

__all__ = ["ReseedEachEpoch", "epoch_seed", "seed_everything"]


class ReseedEachEpoch(Callback):
    """Reseed the global generators at the start of each training epoch (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        seed_everything(epoch_seed(self.seed, trainer.current_epoch))
