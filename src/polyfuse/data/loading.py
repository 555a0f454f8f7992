"""How a task's data loaders run: worker processes, pinned memory, prefetching.

Features are read from disk per batch (:mod:`polyfuse.data.rows`), so a loader's
workers overlap reading with the training step. The number of workers per process is
``data.loader_workers`` or, when that is null, chosen from the cores this process may
use (:func:`default_loader_workers`): a quarter of a process's share of the cores
beyond the two that its compute needs (one intra-op and one inter-op thread), at most
4, so that the workers never take a core from the compute threads:

    per process = max(1, cores // processes)
    workers = min(4, max(0, per process - 2) // 2)

(2 cores: 0 workers, 4: 1, 8: 3, 16: 4). :mod:`polyfuse.engine.threads` gives the
compute the cores the workers leave, and results.json records both.

Batches stay a function of the seed and the epoch with any number of workers: the
samplers run in the main process and draw from their own generators, a worker only
reads and collates the indices it is given, and a loader's own generator (which seeds
the workers) never touches the global one. A training sampler is made at the epoch it
will draw (:func:`epoch_to_draw`): a loader with workers draws its first batches as
soon as Lightning makes its iterator, which on a resumed run happens before Lightning
sets the sampler's epoch. File handles are opened in each worker on
first use (:class:`polyfuse.data.rows.H5File` reopens after a fork). On CUDA the
batches are pinned and the workers persist across epochs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "MAX_DEFAULT_WORKERS", "default_loader_workers", "epoch_to_draw", "free_cores", "loader_options", "loader_workers_of",
]

MAX_DEFAULT_WORKERS = 4


def free_cores() -> int:
    """The number of cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def default_loader_workers(processes: int = 1, cores: int | None = None) -> int:
    """Loader workers per process when ``data.loader_workers`` is null (module doc)."""
    cores = free_cores() if cores is None else int(cores)
    per_process = max(1, cores // max(1, processes))
    return min(MAX_DEFAULT_WORKERS, max(0, per_process - 2) // 2)


def loader_workers_of(config: Mapping[str, Any]) -> int:
    """The loader workers per process of a resolved configuration."""
    configured = config.get("data", {}).get("loader_workers")
    if configured is not None:
        return int(configured)
    return default_loader_workers(int(config.get("trainer", {}).get("devices", 1)))


def loader_options(config: Mapping[str, Any] | None, *, workers: int | None = None) -> dict[str, Any]:
    """Keyword arguments of :class:`torch.utils.data.DataLoader` for a run of ``config``
    (None: no workers, as a checkpoint applied to a handful of samples):
    ``num_workers``, and with workers ``prefetch_factor``; on CUDA ``pin_memory`` and
    ``persistent_workers``."""
    workers = (loader_workers_of(config) if config is not None else 0) if workers is None else int(workers)
    cuda = config is not None and torch.cuda.is_available() and config.get("trainer", {}).get("accelerator") != "cpu"
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": cuda}
    if workers:
        options |= {"prefetch_factor": 2, "persistent_workers": cuda}
    return options


def epoch_to_draw(trainer: Any) -> int:
    """The epoch a training sampler made now will draw: the one Lightning passes to
    ``set_epoch`` before the epoch starts (its processed epochs; 0 without a trainer)."""
    if trainer is None:
        return 0
    return int(trainer.fit_loop.epoch_progress.current.processed)
