"""The global batch of a contrastive loss under DDP, gathered with its gradients.

Shared by the task types ``retrieval`` and ``chimera``. Each of the ``world`` processes
holds its share of every global training batch (:class:`polyfuse.tasks.ranking.data.Shard`:
contiguous, rank by rank, shares differing by at most one row). The losses need every
caption against every video of the global batch, so each process gathers the shares'
embeddings with their gradients (``LightningModule.all_gather(sync_grads=True)``, i.e.
``torch.distributed.nn.functional.all_gather``, as open_clip's ``gather_with_grad``) and
computes the loss of the whole global batch, the same number on every process.

Gradients: the backward of the gathering sums, over the ``world`` processes, the gradient
each one sends to a share, and every process computed the same loss, so a process's own
embeddings receive ``world`` times the gradient of the loss; DDP then averages the
parameters' gradients over the processes (divides by ``world``). The two cancel: every
parameter's gradient is that of one process over the whole batch, with no rescaling
(open_clip's ``local_loss=False``).

Shapes: ``b_r`` the rows of process r (``sizes[r]``), ``B = sum(sizes)``; ``...`` any
further dimensions, equal on every process.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import lightning as L
import torch
from torch import Tensor

__all__ = ["gather_rows", "gather_sum"]


def gather_rows(module: L.LightningModule, rows: Tensor, sizes: Sequence[int]) -> Tensor:
    """(B, ...) the rows of every process, in rank order, from this process's (b_r, ...).

    Differentiable: the gradient reaching a process's rows is the sum of the gradients
    every process sends to them (see the module docstring). ``sizes`` (one per process)
    must be known alike on every process (they come from the global batch); the shares
    are padded to the largest, gathered, and cut back. One process: ``rows`` itself."""
    sizes = [int(s) for s in sizes]
    if len(sizes) == 1:
        return rows
    longest = max(sizes)
    if rows.shape[0] < longest:
        padding = rows.new_zeros((longest - rows.shape[0], *rows.shape[1:]))
        rows = torch.cat((rows, padding))
    with warnings.catch_warnings():  # Lightning's all_gather calls torch.distributed.nn's, which warns
        warnings.filterwarnings("ignore", message=r".*all_gather is deprecated", category=FutureWarning)
        gathered = module.all_gather(rows, sync_grads=True)  # (world, longest, ...)
    return torch.cat([gathered[r, :size] for r, size in enumerate(sizes)])


def gather_sum(module: L.LightningModule, value: Tensor, world: int) -> Tensor:
    """The sum over the processes of a scalar (each process's own), differentiable as
    :func:`gather_rows`; ``value`` itself with one process."""
    if world == 1:
        return value
    return gather_rows(module, value.reshape(1), [1] * world).sum()
