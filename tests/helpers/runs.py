"""Helpers around training runs: a callback that stops a run as a kill would, and the
best epoch read back from a run's CSV log."""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class Interrupt(Callback):
    """Raises ``RuntimeError("interrupted")`` at the start of epoch ``epoch`` (from 0), as a
    killed run would stop: its last checkpoint is the epoch before."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("interrupted")


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as dictionaries."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def best_epoch_of_log(run: Path, monitor: str, mode: str, epochs: int) -> int:
    """The epoch (from 1) of the best ``monitor`` in a run's CSV log, the first of ties
    (a checkpoint is only replaced by a strictly better one)."""
    logged = {}
    for row in csv_rows(next(run.glob("csv/version_*/metrics.csv"))):
        if row.get(monitor) and int(row["epoch"]) < epochs:  # epoch == epochs: the final validation of the best
            logged.setdefault(int(row["epoch"]), float(row[monitor]))
    sign = 1 if mode == "max" else -1
    return max(logged, key=lambda epoch: (sign * logged[epoch], -epoch)) + 1
