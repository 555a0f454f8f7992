"""The spec the ranking task types (``retrieval``, ``chimera``) share: a corpus in splits
(and the test split with its words shuffled), evaluation and prediction over one
whole split, per-caption records, the shuffled-words evaluation (``polyfuse evaluate
--shuffle-words``), the ranking figure (``polyfuse plot ranking``) and the EX1 / EX2
tables of a comparison (``polyfuse compare``).

A subclass names its configuration section (:attr:`RankingSpec.section`) and gives the
data of one split of a checkpoint's corpus (:meth:`RankingSpec.split_data`), the scores of
a split's caption x video pairs from the prediction outputs (:meth:`RankingSpec.split_scores`)
and of one text against the split's videos (:meth:`RankingSpec.query_scores`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
from torch import Tensor
from torch.utils.data import DataLoader

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.data.loading import loader_options
from polyfuse.metrics.retrieval import query_targets, ranks_from_scores
from polyfuse.tasks.ranking.data import RetrievalDataModule, shuffle_words
from polyfuse.tasks.ranking.groups import write_rank_records
from polyfuse.tasks.registry import TaskData, TaskSpec

__all__ = ["SHUFFLED", "SPLITS", "EvalOnly", "RankingSpec", "cache_dir_of", "rank_records", "ranking_data",
           "select_splits"]

#: The splits an evaluation may name (``all``: every video).
SPLITS = ("train", "val", "test", "all")
#: The test split with each caption's words shuffled (Chimera's EX2, seed 0).
SHUFFLED = "test_shuffled"


def select_splits(corpus: RetrievalCorpus, split: Mapping[str, list[str]], names: Sequence[str]) -> dict[str, RetrievalCorpus]:
    """The splits ``names`` of a corpus: ``train``, ``val``, ``test`` (by ``split``), ``all``
    (the whole corpus) and :data:`SHUFFLED`."""
    selected: dict[str, RetrievalCorpus] = {}
    for name in names:
        if name == "all":
            selected[name] = corpus
        elif name == SHUFFLED:
            test = corpus.subset(split["test"])
            selected[name] = RetrievalCorpus(test.video_ids, test.experts, shuffle_words(test.captions, 0),
                                             test.caption_video)
        else:
            selected[name] = corpus.subset(split[name])
    return selected


def cache_dir_of(config: Mapping[str, Any]) -> Path:
    """Where caption vectors and Chimera's LM head are cached: ``<output_dir>/.cache`` (files named by content)."""
    return Path(config.get("output_dir") or "runs") / ".cache"


class EvalOnly(RetrievalDataModule):
    """The loaders of a checkpoint's evaluation: no training split."""

    def __init__(self, splits: dict[str, RetrievalCorpus], collate, eval_batch_size: int, *,
                 whole_videos: bool = False, **options: Any) -> None:
        L.LightningDataModule.__init__(self)
        self.splits, self.collate, self.whole_videos, self.options = splits, collate, bool(whole_videos), options
        self.batch_size, self.eval_batch_size, self.seed = 2, int(eval_batch_size), 0
        self.text_encoder = None


def ranking_data(config: Mapping[str, Any], prepared: Any, collate, *, whole_videos: bool = False) -> TaskData:
    """The :class:`TaskData` of ``prepared`` (whose ``splits`` are corpora): a training data
    module when there is a ``train`` split, the evaluation loaders alone otherwise.
    ``whole_videos``: each process holds every video at evaluation (a cross-encoder)."""
    splits = prepared.splits
    if "train" in splits:
        datamodule = RetrievalDataModule(splits, collate, batch_size=config["data"]["batch_size"],
                                         eval_batch_size=config["data"]["eval_batch_size"], seed=config["seed"],
                                         whole_videos=whole_videos, **loader_options(config))
        steps = len(datamodule.sampler)
    else:
        datamodule = EvalOnly(splits, collate, config["data"]["eval_batch_size"], whole_videos=whole_videos,
                              **loader_options(config))
        steps = 1
    return TaskData(datamodule, prepared, {name: len(corpus.captions) for name, corpus in splits.items()}, steps)


def rank_records(captions: Sequence[str], caption_videos: Sequence[str], video_ids: Sequence[str],
                 scores: Tensor) -> list[dict[str, Any]]:
    """One record per caption from (C, N) caption x video scores: the caption, its video,
    that video's rank among the ``video_ids`` and the top five videos."""
    ranks = ranks_from_scores(scores, query_targets(caption_videos, video_ids))
    top = scores.topk(min(5, len(video_ids)), dim=1).indices
    return [{"caption": captions[i], "video_id": caption_videos[i], "rank": int(ranks[i]),
             "top5": " ".join(video_ids[j] for j in top[i].tolist())} for i in range(len(captions))]


class RankingSpec(TaskSpec):
    """The spec of a ranking task type (module docstring); a subclass sets ``name``,
    ``section`` and the configuration attributes and implements the hooks below."""

    section: ClassVar[str]
    default_monitor = ("val/rsum", "max")
    prediction_suffix = ".csv"
    reads_own_files = True
    evaluate_options: ClassVar[dict[str, Any]] = {"shuffle_words": False}

    # -- what a ranking task type gives --------------------------------------------
    def split_data(self, extras: Mapping[str, Any], split: str) -> TaskData:
        """The data of one split of a checkpoint's corpus (one of :data:`SPLITS` or
        :data:`SHUFFLED`)."""
        raise NotImplementedError

    def split_scores(self, module: L.LightningModule, outputs: Sequence[Any],
                     corpus: RetrievalCorpus) -> tuple[Tensor, list[str], list[str]]:
        """(C, N) scores of every caption against every video of ``corpus`` from the
        prediction outputs of its chunks, with the captions' videos and the video ids in
        the scores' order."""
        raise NotImplementedError

    def query_scores(self, module: L.LightningModule, extras: Mapping[str, Any], data: TaskData, text: str,
                     caption: int | None) -> Tensor:
        """(N,) scores of one text (the ``caption``-th caption of the split when not None)
        against every video of the checkpoint's split (``data``)."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------
    #: the precisions the ranking losses are written and tested for (their similarity
    #: matrices and log-softmaxes in float32 or under bfloat16 autocast)
    precisions: ClassVar[tuple[str, ...]] = ("32-true", "bf16-mixed")

    def check_config(self, config: Any) -> None:
        if config.trainer.precision not in self.precisions:
            raise ValueError(f"trainer.precision: task.type {self.name} trains in {' or '.join(self.precisions)}, "
                             f"not {config.trainer.precision!r}")

    def checkpoint_split(self, split: str, *, source: str | None = None, modalities: Sequence[str] | None = None,
                        shuffle_words: bool = False) -> str:
        """The split of the corpus a checkpoint is applied to: ``split``, or :data:`SHUFFLED`."""
        if source is not None or modalities:
            raise ValueError(f"{self.name} evaluates on its configuration's corpus: --data and --modalities do not apply")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if shuffle_words and split != "test":
            raise ValueError(f"--shuffle-words: the shuffled captions are drawn for the test split only, not {split!r}")
        return SHUFFLED if shuffle_words else split

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        shuffle_words: bool = False) -> TaskData:
        name = self.checkpoint_split(split, source=source, modalities=modalities, shuffle_words=shuffle_words)
        data = self.split_data(extras, name)
        data.split = name
        return data

    def loaders(self, data: TaskData, split: str) -> dict[str, DataLoader]:
        name = data.split or split
        return {name: data.datamodule.loader(name)}

    def loader(self, data: TaskData, split: str) -> DataLoader:
        """The one evaluation loader of ``split``."""
        (loader,) = self.loaders(data, split).values()
        return loader

    def after_test(self, module: L.LightningModule, data: TaskData, run_dir: Path) -> dict[str, Any]:
        """The test split ranked again with each caption's words shuffled (EX2), when the
        run prepared it (``<section>.shuffled_test``)."""
        if SHUFFLED not in data.prepared.splits:
            return {}
        return {"test_shuffled_words": module.evaluate(data.datamodule.loader(SHUFFLED))}

    def records(self, module: L.LightningModule, outputs: Mapping[str, Sequence[Any]], data: TaskData,
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One record per caption of the split: the caption, its video, the rank of that
        video among the split's and the top five videos."""
        ((name, chunks),) = outputs.items()
        corpus = data.prepared.splits[name]
        scores, caption_videos, video_ids = self.split_scores(module, chunks, corpus)
        return rank_records(corpus.captions, caption_videos, video_ids, scores)

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        write_rank_records(records, path)

    def ranking_figure(self, module: L.LightningModule, extras: Mapping[str, Any], out: Path, *, split: str,
                       query: str | None, caption: int | None, top: int, clips: str | None) -> tuple[list[Path], list[str]]:
        from polyfuse.tasks.ranking.figure import check_query, ranking_figure

        check_query(query, caption, top)  # before the split is read
        data = self.checkpoint_data(extras, split=split)
        return ranking_figure(data.prepared.splits[data.split],
                              lambda text, row: self.query_scores(module, extras, data, text, row), out,
                              split=split, query=query, caption=caption, top=top, clips=clips,
                              source=extras["config"][self.section].get("source"))

    def summary(self, summary: Sequence[Mapping[str, Any]], out_dir: Path) -> str | None:
        """EX1 and EX2 (:mod:`polyfuse.tasks.ranking.tables`) from the comparison's runs."""
        from polyfuse.tasks.ranking.tables import ranking_tables

        return ranking_tables(out_dir)
