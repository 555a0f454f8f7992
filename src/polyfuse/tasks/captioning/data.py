"""Video captioning data for the engine: modalities, captions, splits, vocabulary, batches.

A batch is a dict:

- ``inputs``: one (B, T_i, d_i) float tensor per modality, padded steps zero;
- ``masks``: one (B, T_i) bool tensor per modality, True at real steps;
- ``captions``: (B, L) long, ``<bos> words <eos>`` padded with 0 (caption batches);
- ``videos``: the B video ids.

Training and validation batches hold one (video, caption) pair per sample; test and
predict batches one video per sample (``captions`` absent).

The features stay in their files (:mod:`polyfuse.data.sequences`): a batch reads its
videos' rows, pads them to its longest video, keeps every ``frame_stride``-th step and
standardises them with the statistics of the training steps, computed once at
preparation (:data:`EXACT_STATISTICS_BYTES`), so that memory does not grow with the data
set. The reading happens in the collate function, in the loaders' workers; the samplers
stay in the main process, so the batches are those of the seed and epoch whatever the
number of workers. A video with NaN or Inf features is refused when it is read (the
training videos at preparation), naming the file and the video.

Data parallel (N processes): ``batch_size`` and ``eval_batch_size`` are the global
batches, those of one process. Each global batch is drawn as one process draws it and
split into N contiguous shares in process order (:func:`share_of`), so every process
runs the same number of steps and, read in process order, the shares are the batch of
one process. Pair batches also carry

- ``token_share``: float, this process's target tokens over the global batch's (1.0 on
  one process): the weight of its per-token mean loss, so that DDP's average of the
  processes' gradients is the gradient of the global batch's per-token mean;
- ``global_size``: the number of pairs of the global batch.

A share left empty (a global batch smaller than N) holds the batch's first pair with
``token_share`` 0 (it weighs nothing but still takes part in the gradient all-reduce),
or, for videos, no video (``videos`` empty; the inputs of the first video, unused).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from polyfuse.data.formats.captioning import (
    VideoFeatures,
    Vocabulary,
    load_captions,
    load_splits,
    open_video_features,
)
from polyfuse.data.loading import epoch_to_draw, loader_options

__all__ = [
    "EXACT_STATISTICS_BYTES", "CaptioningData", "CaptioningDataModule", "ReplayedShuffleSampler", "pair_batch",
    "prepare_captioning", "share_of", "training_statistics", "video_batch",
]

SPLITS = ("train", "val", "test")


#: training steps that take at most this many bytes as float32 are standardised with
#: statistics computed as before features were streamed: one float32 array of every real
#: training step, ``mean(0)`` and ``std(0)`` (unbiased) by torch, so that RESULTS.md's
#: runs reproduce bit for bit; more are reduced in a streamed float64 pass over chunks of
#: videos (exact means and variances, combined per chunk), the same up to rounding. Memory
#: stays bounded either way. ``POLYFUSE_EXACT_STATS_BYTES`` sets it (as for tabular data).
EXACT_STATISTICS_BYTES = int(os.environ.get("POLYFUSE_EXACT_STATS_BYTES", str(256 << 20)))


@dataclass
class CaptioningData:
    """Everything a captioning run reads, checked. The features stay in their files and
    are read per batch (:meth:`gather`), in the data loader's workers."""

    modalities: list[str]
    features: list[VideoFeatures]  # per modality, read per batch
    lengths: list[Tensor]  # per modality (N,) long: steps of each row after the stride
    videos: list[str]  # row -> video id
    captions: dict[str, list[str]]  # video id -> reference captions (raw text)
    splits: dict[str, list[str]]  # split -> video ids (with features)
    vocabulary: Vocabulary
    max_words: int
    skipped: dict[str, int] = field(default_factory=dict)  # split -> videos skipped
    #: per modality (mean, std) (d,) of the training steps the batches are standardised
    #: with; None: the features are used as read
    statistics: list[tuple[Tensor, Tensor]] | None = None

    @property
    def input_dims(self) -> list[int]:
        return [features.dim for features in self.features]

    @property
    def max_lengths(self) -> list[int]:
        return [int(lengths.max()) for lengths in self.lengths]

    def row_of(self, video: str) -> int:
        return self._rows[video]

    def __post_init__(self) -> None:
        self._rows = {video: row for row, video in enumerate(self.videos)}

    def pairs(self, split: str) -> list[tuple[int, list[int]]]:
        """(row, token ids) of every caption of the split's videos."""
        return [
            (self._rows[v], self.vocabulary.encode(c, self.max_words))
            for v in self.splits[split] for c in self.captions[v]
        ]

    def gather(self, rows: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Per modality, the (B, T, d) features of ``rows`` read from the file, padded with
        zeros to the longest of the batch (T) and standardised, and the (B, T) mask of the
        real steps. A video with NaN or Inf features is refused as it is read."""
        videos = [self.videos[row] for row in rows.tolist()]
        inputs, masks = [], []
        for m, (features, lengths) in enumerate(zip(self.features, self.lengths, strict=True)):
            length = lengths[rows]
            steps = int(length.max())
            batch = torch.zeros(len(videos), steps, features.dim)
            for i, array in enumerate(features.read(videos)):
                batch[i, : array.shape[0]] = torch.from_numpy(array)
            real = torch.arange(steps) < length[:, None]
            if self.statistics is not None:  # padding stays zero
                mean, std = self.statistics[m]
                batch = ((batch - mean) / std) * real.unsqueeze(-1)
            inputs.append(batch)
            masks.append(real)
        return inputs, masks


def training_statistics(features: VideoFeatures, videos: Sequence[str]) -> tuple[Tensor, Tensor]:
    """(mean, std) (d,) float32 of every real step of ``videos``, std unbiased and at
    least 1e-6, read a chunk of videos at a time (see :data:`EXACT_STATISTICS_BYTES`)."""
    steps = sum(features.length(video) for video in videos)
    if steps * features.dim * 4 <= EXACT_STATISTICS_BYTES:
        values = torch.empty(steps, features.dim)
        start = 0
        for group in features.chunks(videos):
            for array in features.read(group):
                values[start : start + array.shape[0]] = torch.from_numpy(array)
                start += array.shape[0]
        mean, std = values.mean(dim=0), values.std(dim=0)
    else:  # Chan et al.'s pairwise combination of per-chunk means and squared deviations
        count, total_mean, squares = 0, np.zeros(features.dim), np.zeros(features.dim)
        for group in features.chunks(videos):
            chunk = np.concatenate(features.read(group)).astype(np.float64)
            n = chunk.shape[0]
            chunk_mean = chunk.mean(axis=0)
            delta = chunk_mean - total_mean
            total_mean = total_mean + delta * (n / (count + n))
            squares = squares + ((chunk - chunk_mean) ** 2).sum(axis=0) + delta**2 * (count * n / (count + n))
            count += n
        mean = torch.from_numpy(total_mean.astype(np.float32))
        std = torch.from_numpy(np.sqrt(squares / max(count - 1, 1)).astype(np.float32))
    return mean, std.clamp_min(1e-6)


def prepare_captioning(
    features: Mapping[str, str | Path],
    captions: str | Path,
    splits: str | Path,
    *,
    base: str | Path | None = None,
    frame_stride: int = 1,
    missing_features: str = "error",
    min_count: int = 2,
    max_words: int = 20,
    vocabulary: Sequence[str] | None = None,
    standardize: bool = True,
) -> CaptioningData:
    """Load and check a captioning data set (see :mod:`polyfuse.data.formats.captioning`).

    Args:
        features: modality name -> feature file spec, in modality order.
        vocabulary: the words of a trained model (default: built from the training
            captions with ``min_count``).
        standardize: subtract each feature's mean and divide by its standard deviation
            over the real steps of the training videos (padding stays zero).
        missing_features: a split video lacking captions or features in some modality:
            ``"error"`` (naming it), or ``"skip"`` (dropped, counted in ``skipped``, warned).
    """
    if missing_features not in ("error", "skip"):
        raise ValueError(f"missing_features must be 'error' or 'skip', got {missing_features!r}")
    modalities = [open_video_features(spec, name, base=base, stride=frame_stride) for name, spec in features.items()]
    caption_path = Path(captions) if base is None or Path(captions).is_absolute() else Path(base) / captions
    split_path = Path(splits) if base is None or Path(splits).is_absolute() else Path(base) / splits
    all_captions = load_captions(caption_path)
    all_splits = load_splits(split_path)
    kept: dict[str, list[str]] = {}
    skipped: dict[str, int] = {}
    for split in SPLITS:
        kept[split], skipped[split] = [], 0
        for video in all_splits[split]:
            lacking = [m.name for m in modalities if video not in m]
            if video not in all_captions:
                lacking.insert(0, f"captions ({caption_path})")
            if not lacking:
                kept[split].append(video)
                continue
            if missing_features == "error":
                sources = {m.name: m.source for m in modalities}
                named = ", ".join(f"{name} ({sources[name]})" if name in sources else name for name in lacking)
                raise ValueError(
                    f"video {video!r} of the {split} split (in {split_path}) has no {named}; "
                    "set captioning.missing_features: skip to leave such videos out"
                )
            skipped[split] += 1
    if any(skipped.values()):
        warnings.warn(
            "captioning: skipped videos without captions or features: "
            + ", ".join(f"{n} of {s}" for s, n in skipped.items() if n),
            RuntimeWarning, stacklevel=2,
        )
    for split in SPLITS:
        if not kept[split]:
            raise ValueError(f"the {split} split of {split_path} has no video with captions and features")
    videos = [v for split in SPLITS for v in kept[split]]
    lengths = [torch.tensor([m.length(v) for v in videos], dtype=torch.long) for m in modalities]
    # per feature, over the real steps of the training videos (read once, a chunk at a time)
    statistics = [training_statistics(m, kept["train"]) for m in modalities] if standardize else None
    if vocabulary is None:
        vocab = Vocabulary.build((c for v in kept["train"] for c in all_captions[v]), min_count)
    else:
        vocab = Vocabulary(list(vocabulary))
    return CaptioningData(
        [m.name for m in modalities], modalities, lengths, videos,
        {v: all_captions[v] for v in videos}, kept, vocab, int(max_words), skipped, statistics,
    )


def share_of(items: Sequence[Any], rank: int, world: int) -> list[Any]:
    """Process ``rank``'s share of a global batch of ``world`` processes: the contiguous
    items ``[n rank // world, n (rank + 1) // world)``; the shares in process order are
    ``items``, their sizes differ by at most one."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    size = len(items)
    return list(items[size * rank // world : size * (rank + 1) // world])


def _targets(ids: Sequence[int]) -> int:
    """Target tokens of an encoded caption: every token after ``<bos>`` but padding (0)."""
    return sum(1 for token in ids[1:] if token != 0)


def _pad(sequences: Sequence[Sequence[int]]) -> Tensor:
    length = max(len(s) for s in sequences)
    return torch.tensor([list(s) + [0] * (length - len(s)) for s in sequences], dtype=torch.long)


class ReplayedShuffleSampler(Sampler[int]):
    """The order of ``DataLoader(..., shuffle=True, generator=Generator().manual_seed(seed))``
    built once and iterated epoch after epoch, as a function of (seed, epoch): a run
    resumed at epoch e (Lightning calls :meth:`set_epoch`) trains on the batches of the
    uninterrupted run. Such a loader draws from its generator, per epoch, the loader
    iterator's base seed (one int64), the permutation, and the empty remainder's
    permutation of torch's ``RandomSampler``; the draws of the epochs before are replayed."""

    def __init__(self, size: int, *, seed: int) -> None:
        self.size, self.seed, self.epoch = int(size), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.epoch):  # replay the draws of the epochs before
            torch.empty((), dtype=torch.int64).random_(generator=generator)
            torch.randperm(self.size, generator=generator)
            torch.randperm(self.size, generator=generator)
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


def pair_batch(data: CaptioningData, rank: int, world: int, items: list[tuple[int, list[int]]]) -> dict[str, Any]:
    """Process ``rank``'s share of the global batch of caption pairs ``items``, its
    features read from the files (a loader's collate: it runs in the workers)."""
    share = share_of(items, rank, world)
    tokens, mine = (sum(_targets(ids) for _, ids in part) for part in (items, share))
    taken = share or items[:1]  # an empty share: the batch's first pair, weighing nothing
    rows = torch.tensor([row for row, _ in taken])
    inputs, masks = data.gather(rows)
    return {"inputs": inputs, "masks": masks, "captions": _pad([ids for _, ids in taken]),
            "videos": [data.videos[r] for r in rows.tolist()],
            "token_share": mine / tokens if tokens else 0.0, "global_size": len(items)}


def video_batch(data: CaptioningData, rank: int, world: int, videos: list[str]) -> dict[str, Any]:
    """Process ``rank``'s share of the global batch ``videos`` (a loader's collate)."""
    share = share_of(videos, rank, world)
    rows = torch.tensor([data.row_of(v) for v in share or videos[:1]])  # an empty share: unused inputs
    inputs, masks = data.gather(rows)
    return {"inputs": inputs, "masks": masks, "videos": share}


class CaptioningDataModule(L.LightningDataModule):
    """Caption-pair batches for training and validation, video batches for test and
    predict; under data parallel, each process's share of every global batch (see the
    module docstring). The samplers run in this process; the batches are read and
    collated in the loaders' workers (``loader``: :func:`polyfuse.data.loading.loader_options`,
    default none)."""

    def __init__(self, data: CaptioningData, *, batch_size: int, eval_batch_size: int, seed: int = 0,
                 loader: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.data = data
        self.batch_size, self.eval_batch_size, self.seed = int(batch_size), int(eval_batch_size), int(seed)
        self.options = dict(loader or loader_options(None))  # DataLoader's workers, pinning, prefetching
        self._pairs = {split: data.pairs(split) for split in ("train", "val")}

    def _world(self) -> tuple[int, int]:
        """(rank, number of processes) of the trainer this module serves; (0, 1) without one."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _pair_batch(self, rank: int, world: int, items: list[tuple[int, list[int]]]) -> dict[str, Any]:
        return pair_batch(self.data, rank, world, items)

    def _video_batch(self, rank: int, world: int, videos: list[str]) -> dict[str, Any]:
        return video_batch(self.data, rank, world, videos)

    def train_dataloader(self) -> DataLoader:
        sampler = ReplayedShuffleSampler(len(self._pairs["train"]), seed=self.seed)
        sampler.set_epoch(epoch_to_draw(self.trainer))  # workers draw their first indices on creation
        return DataLoader(self._pairs["train"], batch_size=self.batch_size, sampler=sampler,
                          collate_fn=partial(pair_batch, self.data, *self._world()), generator=self._quiet_generator(),
                          **self.options)

    def _quiet_generator(self) -> torch.Generator:
        """The loader's own generator: building its iterator never draws from the global RNG."""
        return torch.Generator().manual_seed(self.seed)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._pairs["val"], batch_size=self.eval_batch_size,
                          collate_fn=partial(pair_batch, self.data, *self._world()), generator=self._quiet_generator(),
                          **self.options)

    def loader(self, split: str) -> DataLoader:
        """An evaluation loader over the videos of ``split`` (``train``, ``val``, ``test``;
        ``all``: every video), as every data module's ``loader``."""
        if split == "all":
            return self.video_loader(list(self.data.videos))
        key = split
        if key not in self.data.splits:
            raise ValueError(f"no {split!r} split; have train, val, test, all")
        return self.video_loader(self.data.splits[key])

    def video_loader(self, videos: Sequence[str]) -> DataLoader:
        return DataLoader(list(videos), batch_size=self.eval_batch_size,
                          collate_fn=partial(video_batch, self.data, *self._world()), generator=self._quiet_generator(),
                          **self.options)

    def test_dataloader(self) -> DataLoader:
        return self.video_loader(self.data.splits["test"])
