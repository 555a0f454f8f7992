"""Text-video retrieval data for the engine: corpora, caption vectors, batches of distinct videos.

Shared by the task types ``retrieval`` (:mod:`polyfuse.tasks.retrieval.spec`) and
``chimera`` (:mod:`polyfuse.tasks.chimera.spec`).

* :class:`RetrievalSourceConfig`: where a corpus comes from (the MSVD folder, a
  ``synthetic:...`` spec, or expert files + captions + id lists); the base of both
  tasks' configuration sections.
* :func:`load_corpus`, :func:`text_encoder`, :func:`encode_captions` (cached by content:
  the file is named by a hash of the captions and of the encoder's weights and
  vocabulary, so a run with another word-vector file never reads this one's vectors).
* :func:`video_batch`: the experts of some videos, read from their files per batch.
* :class:`DistinctVideoBatches`: a training epoch as batches of distinct videos, each
  with one of its captions drawn uniformly, from a generator seeded by the run's seed
  and the epoch number (Lightning calls ``set_epoch``): a resumed run draws the same
  batches as the uninterrupted one.
* :class:`SplitChunks`: a whole split for evaluation, as chunks that each hold some of
  its videos and some of its captions; the module ranks once it has seen them all.
* :class:`Shard`: under DDP, process ``rank`` of ``world`` takes a contiguous share of
  every global training batch (the draw is that of one process) and of each split's
  captions (and videos) at evaluation; the modules gather what the loss and the ranking
  need (:mod:`polyfuse.tasks.ranking.gather`).

A training batch is what the task's collate makes of the (video row, caption row) pairs
of the process's share (``collate(split_name, pairs, shard)``). An evaluation chunk holds
``video_rows`` and ``caption_rows`` (either may be empty). The collate reads the videos'
expert features from their files, so with ``data.loader_workers`` the reading runs in
the loader's workers (:mod:`polyfuse.data.loading`); the samplers stay in the main
process, so the batches do not depend on the number of workers.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from polyfuse.atomic import atomic_temp_path, write_bytes
from polyfuse.data.formats.experts import RetrievalCorpus, load_captions, load_expert, read_id_list
from polyfuse.data.loading import epoch_to_draw
from polyfuse.data.sources import is_synthetic

__all__ = [
    "CORPUS_SPLITS",
    "ONE_PROCESS",
    "DistinctVideoBatches",
    "RetrievalDataModule",
    "RetrievalSourceConfig",
    "Shard",
    "SplitChunks",
    "captions_by_video",
    "content_cache_path",
    "corpus_vocabulary",
    "encode_captions",
    "encoder_fingerprint",
    "load_corpus",
    "shuffle_words",
    "video_batch",
]

#: The splits of a retrieval corpus, in order.
CORPUS_SPLITS = ("train", "val", "test")


class RetrievalSourceConfig(BaseModel):
    """Where a retrieval corpus comes from (the base of the ``retrieval`` and ``chimera`` sections)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)

    source: str | None = Field(
        None, description="the MSVD folder (relative to the config file), or synthetic:videos=N,experts=m,steps=S,"
        "dim=D,events=E,noise=X,seed=K (planted events; text: bow)")
    experts: dict[str, str] | None = Field(
        None, description="instead of source: expert name -> feature file (.npz / .h5, relative to the config file)")
    captions: str | None = Field(None, description="with experts: captions JSON {video_id: [caption, ...]}")
    splits: dict[str, str] | None = Field(
        None, description="with experts: {train: ids file, val: ids file, test: ids file} (one video id a line)")

    @model_validator(mode="after")
    def _one_source(self) -> RetrievalSourceConfig:
        given = self.source is not None
        if given == bool(self.experts):
            raise ValueError("give either source (MSVD folder or synthetic:...) or experts + captions + splits")
        if self.experts:
            if not self.captions or not self.splits:
                raise ValueError("experts needs captions and splits ({train, val, test} id files)")
            if sorted(self.splits) != sorted(CORPUS_SPLITS):
                raise ValueError(f"splits must name train, val and test, got {', '.join(self.splits)}")
        elif self.captions or self.splits:
            raise ValueError("captions and splits go with experts, not with source")
        return self


def load_corpus(section: dict[str, Any]) -> tuple[RetrievalCorpus, dict[str, list[str]]]:
    """The corpus of a validated :class:`RetrievalSourceConfig` (as a dict) and its split."""
    source = section.get("source")
    if source is not None and is_synthetic(source):
        from polyfuse.data.synthetic_retrieval import synthetic_retrieval_split

        return synthetic_retrieval_split(source)
    if source is not None:
        from polyfuse.data.formats.msvd_retrieval import load_msvd_retrieval

        return load_msvd_retrieval(source)
    loaded = {name: load_expert(path, name) for name, path in section["experts"].items()}
    split = {name: read_id_list(section["splits"][name]) for name in CORPUS_SPLITS}
    all_ids = [v for ids in split.values() for v in ids]
    return RetrievalCorpus.build(loaded, load_captions(section["captions"]), all_ids), split


def video_batch(corpus: RetrievalCorpus, rows: Sequence[int] | Tensor) -> dict[str, Any]:
    """The experts of the videos ``rows`` of ``corpus``, read from their files
    (:meth:`~polyfuse.data.formats.experts.ExpertFeatures.gather`), each padded to the
    expert's longest sequence in its file, not the batch's: MAN's ``auto`` mode picks its
    estimator (exact or had) from the padded lengths, so a batch-dependent padding could
    change the estimator from batch to batch (the other fusions ignore masked steps)."""
    gathered = [expert.gather(rows, expert.steps) for expert in corpus.experts.values()]
    return {"features": [features for features, _, _ in gathered], "masks": [mask for _, mask, _ in gathered],
            "present": torch.stack([present for _, _, present in gathered], dim=1)}


def corpus_vocabulary(corpus: RetrievalCorpus) -> list[str]:
    """The sorted words of a corpus's captions (the vocabulary of ``text: bow``)."""
    return sorted({word for caption in corpus.captions for word in caption.split()})


def shuffle_words(captions: Sequence[str], seed: int) -> list[str]:
    """Each caption with its whitespace-separated words in a random order (Chimera EX2)."""
    rng = random.Random(seed)
    out = []
    for caption in captions:
        words = caption.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return out


def encoder_fingerprint(encoder) -> str:
    """A hash of everything an encoder's output depends on: its class, its vocabulary
    (``index`` or ``vocabulary``), ``max_length`` and every tensor of its state (names,
    dtypes, shapes and bytes). Two word-vector files give two fingerprints."""
    digest = hashlib.sha256(f"{type(encoder).__module__}.{type(encoder).__qualname__}".encode())
    for attribute in ("index", "vocabulary", "max_length"):
        if hasattr(encoder, attribute):
            digest.update(f"{attribute}={json.dumps(getattr(encoder, attribute))}".encode())
    state = encoder.state_dict() if hasattr(encoder, "state_dict") else {}
    for name, tensor in state.items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def content_cache_path(cache_dir: str | Path | None, prefix: str, key_parts: object) -> Path | None:
    """``<cache_dir>/<prefix>_<hash>.safetensors``, the hash over ``key_parts`` (JSON):
    a file named by the content of what it caches; None without a cache folder."""
    if cache_dir is None:
        return None
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:32]
    return Path(cache_dir) / f"{prefix}_{key}.safetensors"


def _read_cache(cache: Path, count: int) -> Tensor | None:
    """The vectors of a cache file, or None (with a warning) when it is broken or foreign:
    a half-written cache is rebuilt, never trusted."""
    try:
        with safe_open(str(cache), framework="pt") as handle:
            vectors = handle.get_tensor("vectors")
    except (SafetensorError, OSError) as error:
        warnings.warn(f"{cache}: a broken caption cache ({error}); rebuilding it", stacklevel=3)
        return None
    if vectors.ndim != 2 or vectors.shape[0] != count or not bool(vectors.isfinite().all()):
        warnings.warn(f"{cache}: the caption cache does not hold {count} finite vectors; rebuilding it",
                      stacklevel=3)
        return None
    return vectors


def encode_captions(encoder, captions: Sequence[str], *, batch_size: int = 128, cache_dir: Path | None = None,
                    bar: Any = None) -> Tensor:
    """(C, d_t) sentence vectors of a frozen encoder, cached by content.

    The cache file is named by a hash of the captions and of the encoder
    (:func:`encoder_fingerprint`: a run with another word-vector file never reads
    this one's vectors), written atomically (a temporary file renamed), and a cache
    that cannot be read (truncated, empty) is rebuilt. ``bar`` (a
    :func:`polyfuse.progress.progress_bar`) is advanced by the captions encoded, not by
    those read from the cache."""
    cache = content_cache_path(cache_dir, "text", [list(captions), encoder_fingerprint(encoder)])
    if cache is not None and cache.is_file():
        vectors = _read_cache(cache, len(captions))
        if vectors is not None:
            return vectors
    split_names = []
    with torch.no_grad():
        for start in range(0, len(captions), batch_size):
            split_names.append(encoder(list(captions[start : start + batch_size])).sentence)
            if bar is not None:
                bar.update(len(split_names[-1]))
    vectors = torch.cat(split_names)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_temp_path(cache) as partial:
            write_bytes(partial, save({"vectors": vectors.contiguous()}))
    return vectors


def captions_by_video(corpus: RetrievalCorpus) -> list[list[int]]:
    """For each video row of ``corpus``, the rows of its captions."""
    row_of = {video: i for i, video in enumerate(corpus.video_ids)}
    out: list[list[int]] = [[] for _ in corpus.video_ids]
    for caption, video in enumerate(corpus.caption_video):
        out[row_of[video]].append(caption)
    return out


class Shard(NamedTuple):
    """Process ``rank`` of ``world``: its contiguous share of a batch or of a split.

    Shares differ by at most one row, the larger first, and in rank order they are the
    whole in its order: gathering the shares rank by rank gives back the batch of one
    process."""

    rank: int = 0
    world: int = 1

    def sizes(self, size: int) -> list[int]:
        """The size of every process's share of ``size`` rows, in rank order."""
        base, extra = divmod(int(size), self.world)
        return [base + (r < extra) for r in range(self.world)]

    def bounds(self, size: int) -> tuple[int, int]:
        """``(start, stop)`` of this process's share of ``size`` rows."""
        sizes = self.sizes(size)
        start = sum(sizes[: self.rank])
        return start, start + sizes[self.rank]


#: The share of one process alone: the whole batch or split.
ONE_PROCESS = Shard()


class DistinctVideoBatches(Sampler[list[tuple[int, int]]]):
    """One training epoch: the videos in a random order, cut into batches of
    ``batch_size`` distinct videos, each with one of its captions drawn uniformly.
    A last batch of fewer than ``min_batch`` videos (2: no negative to rank against; under
    DDP at least one per process) is dropped.

    These are the *global* batches: every process draws the same ones and takes its
    share (:class:`Shard`), so N processes see the batches of one.

    The draws come from a generator seeded by ``seed`` and the epoch (:meth:`set_epoch`,
    which Lightning calls before each epoch), never from the global one."""

    def __init__(self, captions_of: Sequence[Sequence[int]], batch_size: int, seed: int) -> None:
        if batch_size < 2:
            raise ValueError(f"retrieval batches need at least 2 videos, got batch_size={batch_size}")
        if any(not captions for captions in captions_of):
            raise ValueError("a training video has no caption")
        self.captions_of = [list(c) for c in captions_of]
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = 0
        self.min_batch = 2
        # Lightning calls set_epoch before each epoch on a loader's ``sampler`` and on its
        # ``batch_sampler.sampler``, not on the batch sampler itself: this is both.
        self.sampler = self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        full, rest = divmod(len(self.captions_of), self.batch_size)
        return full + (rest >= self.min_batch)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.captions_of), generator=generator).tolist()
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            if len(rows) < self.min_batch:
                continue
            picks = torch.randint(2**62, (len(rows),), generator=generator).tolist()
            yield [(r, self.captions_of[r][p % len(self.captions_of[r])]) for r, p in zip(rows, picks, strict=True)]


class _Pairs(Dataset):
    """The (video row, caption row) pairs a batch sampler yields, returned as they are."""

    def __len__(self) -> int:  # pragma: no cover - only batch samplers index it
        return 0

    def __getitem__(self, pair: tuple[int, int]) -> tuple[int, int]:
        return pair


class SplitChunks(Dataset):
    """A whole split in ``ceil(max(N, C) / size)`` chunks: chunk k holds video rows and
    caption rows ``[k size, (k + 1) size)`` (either may be empty at the end).

    With a ``shard``, the chunks of that process's share of the captions and of the
    videos (all the videos with ``whole_videos``: a cross-encoder scores its captions
    against the whole gallery)."""

    def __init__(self, videos: int, captions: int, size: int, shard: Shard = ONE_PROCESS, *,
                 whole_videos: bool = False) -> None:
        self.size = int(size)
        self.video_range = (0, int(videos)) if whole_videos else shard.bounds(videos)
        self.caption_range = shard.bounds(captions)

    def __len__(self) -> int:
        longest = max(stop - start for start, stop in (self.video_range, self.caption_range))
        return -(-longest // self.size)

    def _rows(self, bounds: tuple[int, int], k: int) -> Tensor:
        start, stop = bounds[0] + k * self.size, bounds[1]
        return torch.arange(start, max(start, min(start + self.size, stop)))

    def __getitem__(self, k: int) -> dict[str, Tensor]:
        return {"video_rows": self._rows(self.video_range, k), "caption_rows": self._rows(self.caption_range, k)}


class RetrievalDataModule(L.LightningDataModule):
    """Loaders over the splits of a retrieval corpus.

    ``collate(split_name, batch, shard)`` turns a global training batch (video and caption rows
    of that split) and the process's :class:`Shard`, or an evaluation chunk, into tensors;
    it is the task's (what a batch carries differs between ``retrieval`` and ``chimera``),
    the sampling is this module's. Under DDP the validation and test loaders give each
    process its share of the captions, and of the videos unless ``whole_videos`` (each
    process then holds every video: a cross-encoder scores its captions against them all).
    :meth:`loader` is always the whole split (an evaluation in one process)."""

    whole_videos = False

    def __init__(self, splits: dict[str, RetrievalCorpus], collate, *, batch_size: int, eval_batch_size: int,
                 seed: int, whole_videos: bool = False, **options: Any) -> None:
        super().__init__()
        self.whole_videos = bool(whole_videos)
        self.options = options  # DataLoader keywords (polyfuse.data.loading.loader_options)
        self.splits = splits
        self.collate = collate
        self.batch_size, self.eval_batch_size, self.seed = int(batch_size), int(eval_batch_size), int(seed)
        self.sampler = DistinctVideoBatches(captions_by_video(splits["train"]), self.batch_size, self.seed)
        self.text_encoder = None  # the task's encoder, when the module fine-tunes it

    def _shard(self) -> Shard:
        trainer = self.trainer
        return Shard() if trainer is None else Shard(trainer.global_rank, trainer.world_size)

    def train_dataloader(self) -> DataLoader:
        shard = self._shard()
        self.sampler.min_batch = max(2, shard.world)  # every process gets at least one video
        self.sampler.set_epoch(epoch_to_draw(self.trainer))  # workers draw their first batches on creation
        return DataLoader(_Pairs(), batch_sampler=self.sampler, collate_fn=partial(self.collate, "train", shard=shard),
                          generator=self._quiet_generator(), **self.options)

    def _quiet_generator(self) -> torch.Generator:
        """The loader's own generator: building its iterator never draws from the global RNG."""
        return torch.Generator().manual_seed(self.seed)

    def loader(self, split_name: str, shard: Shard = ONE_PROCESS) -> DataLoader:
        """The evaluation chunks of one split (``train``, ``val``, ``test``, or another split
        the task added, e.g. the test split with shuffled words); with a ``shard``, that
        process's share."""
        corpus = self.splits[split_name]
        chunks = SplitChunks(len(corpus.video_ids), len(corpus.captions), self.eval_batch_size, shard,
                             whole_videos=self.whole_videos)
        return DataLoader(chunks, batch_size=None, collate_fn=partial(self.collate, split_name),
                          generator=self._quiet_generator(), **self.options)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", self._shard())

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", self._shard())

    def predict_dataloader(self) -> DataLoader:
        return self.loader("test")

