"""Per-epoch CSV logs written atomically.

Lightning's CSV writer appends rows, and when a new column appears it truncates
``metrics.csv`` and writes it again: a crash (or a full disk) in between loses
the logged epochs. :class:`AtomicCSVLogger` writes the whole file to a
temporary name and renames it over the old one, so ``metrics.csv`` always holds
every saved row.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from polyfuse.engine.rundir import atomic_temp_path

__all__ = ["AtomicCSVLogger", "AtomicExperimentWriter"]


class AtomicExperimentWriter(ExperimentWriter):
    """Lightning's CSV experiment writer; :meth:`save` replaces the file atomically."""

    def save(self) -> None:
        if not self.metrics:
            return
        self._record_new_keys()
        path = Path(self.metrics_file_path)
        rows = []
        if path.is_file():
            with path.open(newline="") as handle:
                rows = list(csv.DictReader(handle))
        with atomic_temp_path(path) as temp, temp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)
            writer.writerows(self.metrics)
            handle.flush()
            os.fsync(handle.fileno())
        self.metrics = []


class AtomicCSVLogger(CSVLogger):
    """:class:`~lightning.pytorch.loggers.CSVLogger` writing through :class:`AtomicExperimentWriter`."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AtomicExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AtomicExperimentWriter(log_dir=self.log_dir)
        return self._experiment
