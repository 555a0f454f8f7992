"""The Lightning data module: batches of padded modality sequences with masks.

A batch is a dict:

- ``inputs``: one (B, T_j, d_j) float tensor per modality (contextual mode: the
  window of utterances, T_j = W), padded steps zero;
- ``masks``: one (B, T_j) bool tensor per modality, True at real steps;
- ``centre`` (contextual mode only): (B,) long, the position of the sample's
  own row in its window;
- ``target``: (B,) or (B, k) targets (absent without labels);
- ``row``: (B,) long, the sample's row in the source table.

Sequences are cut to the longest real length in the batch, which changes no
result of a padding-invariant model. Training batches come from
:class:`ShardedShuffleSampler`: one permutation per epoch, drawn from the seed
and the epoch, split over the processes, so that N processes each given
``batch_size / N`` samples see exactly the batches of one process.

The collate reads its rows from the prepared :class:`~polyfuse.data.prepare.Features`
(from disk for ``.npz`` / ``.h5`` sources), so it runs in the loader's workers
(``loader_options``, :func:`polyfuse.data.loading.loader_options`) and memory does not
grow with the data; the batches are the same with any number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from polyfuse.data.loading import epoch_to_draw, loader_options
from polyfuse.data.prepare import Features, Split, TabularData

__all__ = ["FusionDataModule", "ShardedShuffleSampler", "SplitBatchesDataModule", "SplitDataset", "collate_rows"]


class SplitDataset(Dataset):
    """Sample i of a split is just i; :func:`collate_rows` gathers the tensors."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> int:
        return index


class _Prepared:
    """What every split's collate reads: the features (rows read per batch), the
    lengths and targets as tensors."""

    def __init__(self, data: TabularData) -> None:
        self.features: list[Features] = list(data.features)
        self.lengths = [torch.from_numpy(n) for n in data.lengths]
        self.targets = None if data.targets is None else torch.from_numpy(data.targets)


def _read(features: Features, rows: Tensor) -> Tensor:
    """(len(rows), T, d) float tensor of the prepared rows ``rows``."""
    return torch.from_numpy(features.rows(rows.numpy()))


def collate_rows(tensors: _Prepared, split: Split, indices: list[int]) -> dict[str, Any]:
    """The batch of samples ``indices`` of ``split`` (see the module docstring)."""
    index = torch.as_tensor(indices, dtype=torch.long)
    rows = torch.from_numpy(split.rows)[index]
    batch: dict[str, Any] = {"row": rows}
    inputs, masks = [], []
    if split.windows is None:
        for features, lengths in zip(tensors.features, tensors.lengths, strict=True):
            length = lengths[rows]
            steps = max(1, int(length.max()))  # a batch may lack a modality entirely
            inputs.append(_read(features, rows)[:, :steps].contiguous())
            masks.append(torch.arange(steps) < length[:, None])
    else:
        windows = torch.from_numpy(split.windows)[index]  # (B, W)
        real = windows >= 0
        steps = int(real.sum(dim=1).max())
        windows, real = windows[:, :steps], real[:, :steps]
        for features in tensors.features:
            unique, inverse = torch.unique(windows.clamp_min(0), return_inverse=True)  # windows overlap: read once
            gathered = _read(features, unique)[inverse, 0]  # (B, W, d)
            inputs.append(gathered * real.unsqueeze(-1))
            masks.append(real)
        batch["centre"] = torch.from_numpy(split.centre)[index]
    batch["inputs"], batch["masks"] = inputs, masks
    if tensors.targets is not None:
        batch["target"] = tensors.targets[rows]
    return batch


class ShardedShuffleSampler(Sampler[int]):
    """A fresh permutation per epoch (from ``seed`` and the epoch), split over processes.

    Process ``rank`` of ``world`` takes every ``world``-th index of the permutation
    starting at ``rank``; with ``world > 1`` the permutation is first padded by
    repeating its start, so that every process gets the same number of samples
    (as torch's DistributedSampler). With ``shuffle=False`` the order is 0..n-1
    and nothing is padded (evaluation: shards may differ by one sample).
    """

    def __init__(self, size: int, *, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside [0, {world})")
        self.size, self.seed, self.rank, self.world, self.shuffle = size, seed, rank, world, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.rank, self.size, self.world))
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        if self.world > 1:
            total = -(-self.size // self.world) * self.world
            order = (order * (-(-total // max(1, len(order)))))[:total]
        return order[self.rank :: self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self._order())

    def __len__(self) -> int:
        if not self.shuffle:
            return len(range(self.rank, self.size, self.world))
        return -(-self.size // self.world) if self.world > 1 else self.size


class FusionDataModule(L.LightningDataModule):
    """Serves the splits of a :class:`TabularData` (see the module docstring).

    Args:
        data: the prepared data.
        batch_size: the *global* training batch; each of N processes takes
            ``batch_size / N`` (which must be a whole number).
        eval_batch_size: per-process batch for validation, test and prediction.
        seed: seed of the training shuffle.
        loader_options: further keyword arguments of every
            :class:`~torch.utils.data.DataLoader` (workers, pinned memory:
            :func:`polyfuse.data.loading.loader_options`); default none (no workers).
    """

    def __init__(self, data: TabularData, *, batch_size: int, eval_batch_size: int = 256, seed: int = 0,
                 loader_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(f"batch sizes must be >= 1, got {batch_size} and {eval_batch_size}")
        self.data = data
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size)
        self.seed = int(seed)
        self.loader_options = dict(loader_options or {})
        self._tensors = _Prepared(data)

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _loader(self, key: str, *, train: bool) -> DataLoader:
        if key not in self.data.splits:
            raise ValueError(f"no {key!r} split; have {', '.join(self.data.splits)}")
        split = self.data.splits[key]
        rank, world = self._world()
        if train:
            if self.batch_size % world:
                raise ValueError(
                    f"data.batch_size {self.batch_size} is the global batch and must be divisible "
                    f"by the {world} processes"
                )
            batch_size = self.batch_size // world
        else:
            batch_size = self.eval_batch_size
        sampler = ShardedShuffleSampler(len(split), seed=self.seed, rank=rank, world=world, shuffle=train)
        sampler.set_epoch(epoch_to_draw(self.trainer))  # workers draw on creation
        tensors = self._tensors
        return DataLoader(
            SplitDataset(split),
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=partial(collate_rows, tensors, split),
            generator=torch.Generator().manual_seed(self.seed),  # never draws from the global RNG
            **self.loader_options,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split, train=False)

    predict_split = "test"

    def loader(self, key: str) -> DataLoader:
        """An evaluation loader over any split (``train``, ``val``, ``test``, ``all``)."""
        return self._loader(key, train=False)

    def sample(self, key: str, index: int) -> dict[str, Tensor]:
        """The batch holding only sample ``index`` of split ``key``."""
        split = self.data.splits[key]
        if not 0 <= index < len(split):
            raise ValueError(f"sample {index} outside the {len(split)} samples of {key!r}")
        return collate_rows(self._tensors, split, [index])


def _split_batch(split: Any, indices: list[int]) -> Any:
    return split.batch(torch.as_tensor(indices, dtype=torch.long))


class SplitBatchesDataModule(L.LightningDataModule):
    """Serves ``data.splits``, each an object that reads its own batches
    (``len(split)`` items, ``split.batch(indices)``: VQA's and grounding's splits, whose
    batches read region features in the loader's workers). Training batches in a fresh
    order per epoch drawn from ``seed`` and the epoch (:class:`ShardedShuffleSampler`,
    made at the epoch it draws: :func:`~polyfuse.data.loading.epoch_to_draw`), each
    process its share of the global ``batch_size``; ``loader``: further
    :class:`~torch.utils.data.DataLoader` keywords (:func:`polyfuse.data.loading.loader_options`)."""

    def __init__(self, data: Any, *, batch_size: int, eval_batch_size: int = 256, seed: int = 0,
                 loader: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.data, self.batch_size, self.eval_batch_size, self.seed = data, int(batch_size), int(eval_batch_size), int(seed)
        self.options = dict(loader or loader_options(None))

    def loader(self, key: str, *, train: bool = False) -> DataLoader:
        if key not in self.data.splits:
            raise ValueError(f"no {key!r} split; have {', '.join(self.data.splits)}")
        split = self.data.splits[key]
        rank, world = (0, 1) if self.trainer is None else (self.trainer.global_rank, self.trainer.world_size)
        if train and self.batch_size % world:
            raise ValueError(f"data.batch_size {self.batch_size} must be divisible by the {world} processes")
        sampler = ShardedShuffleSampler(len(split), seed=self.seed, rank=rank, world=world, shuffle=train)
        sampler.set_epoch(epoch_to_draw(self.trainer))  # workers draw on creation
        return DataLoader(
            list(range(len(split))), batch_size=self.batch_size // world if train else self.eval_batch_size,
            sampler=sampler, collate_fn=partial(_split_batch, split),  # reads the features: in the workers
            # A loader without a generator draws its base seed from the global RNG, which
            # would shift dropout after a resume; this one never touches it.
            generator=torch.Generator().manual_seed(self.seed),
            **self.options,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
