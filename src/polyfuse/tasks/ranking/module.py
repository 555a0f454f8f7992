"""What the Lightning modules of the ranking task types (``retrieval``, ``chimera``) share:
ranking one whole split at validation, at test and outside a trainer.

A module sees a split as chunks (:class:`polyfuse.tasks.ranking.data.SplitChunks`) and
ranks once it has seen them all: :meth:`RankingTask.start_split`, then
:meth:`RankingTask.add_chunk` per chunk, then :meth:`RankingTask.split_metrics` (the
recalls, MedR and MeanR of both directions; ``rsum``, the sum of the six recalls, is
added here). Under DDP (``gather``) what the processes saw is gathered before ranking,
so every process ranks the whole split and logs the numbers of one process (``max``
over equal numbers keeps them exact). Outside a trainer (:meth:`RankingTask.evaluate`)
one process holds the whole split and nothing is gathered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from polyfuse.metrics.retrieval import recall_sum

__all__ = ["RankingTask"]


class RankingTask(L.LightningModule):
    """The evaluation loop of a ranking module (module docstring); a subclass implements
    :meth:`start_split`, :meth:`add_chunk` and :meth:`split_metrics`."""

    def start_split(self, *, chance: bool, gather: bool) -> None:
        """Forget what was seen; the next metrics add the chance recalls (``chance``) and
        gather the processes' shares (``gather``)."""
        raise NotImplementedError

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        """Take in one evaluation chunk of the split."""
        raise NotImplementedError

    def split_metrics(self) -> dict[str, float]:
        """The metrics of everything seen since :meth:`start_split`."""
        raise NotImplementedError

    def validation_extras(self) -> dict[str, float]:
        """Validation metrics beside the ranking's (logged under ``val/``)."""
        return {}

    def _ranked(self) -> dict[str, float]:
        values = self.split_metrics()
        values["rsum"] = recall_sum(values)
        return values

    def _log_stage(self, stage: str, values: Mapping[str, float]) -> None:
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, sync_dist=True, reduce_fx="max")

    def on_validation_epoch_start(self) -> None:
        self.start_split(chance=False, gather=True)

    def validation_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self.add_chunk(batch)

    def on_validation_epoch_end(self) -> None:
        self._log_stage("val", {**self._ranked(), **self.validation_extras()})

    def on_test_epoch_start(self) -> None:
        self.start_split(chance=True, gather=True)

    def test_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self.add_chunk(batch)

    def on_test_epoch_end(self) -> None:
        self._log_stage("test", self._ranked())

    def evaluate(self, loader: DataLoader, *, chance: bool = True) -> dict[str, float]:
        """The metrics of one split's chunks, outside a Trainer (eval mode, float32), in this
        process alone (nothing is gathered: the loader holds the whole split)."""
        was_training = self.training
        self.eval()
        self.start_split(chance=chance, gather=False)
        with torch.no_grad():
            for chunk in loader:
                self.add_chunk(chunk)
        values = self._ranked()
        self.train(was_training)
        return values
