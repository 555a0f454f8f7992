"""Seeds: one seed fixes Python's, numpy's and torch's global generators; an epoch's seed
is a function of the run's seed and the epoch (so a resumed run draws as the
uninterrupted one; :class:`polyfuse.engine.seeding.ReseedEachEpoch` applies it)."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["epoch_seed", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - the global generator that user code draws from
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch`` of a run seeded with ``seed``."""
    return (int(seed) * 1_000_003 + int(epoch) * 7_919 + 17) % 2**63
