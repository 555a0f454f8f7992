"""Task type ``retrieval``: text-video retrieval over expert features (MAN section 3.3).

A training step takes a batch of distinct videos, one of each video's captions drawn
uniformly (:class:`polyfuse.tasks.ranking.data.DistinctVideoBatches`), scores every
caption against every video of the batch and applies the bidirectional max-margin
loss with hardest negatives (``loss: margin``) or InfoNCE (``loss: infonce``).
Validation and test embed every caption and every video of the split and rank the
whole split (:func:`polyfuse.metrics.retrieval.retrieval_ranks`): text-to-video with
each caption a query, video-to-text with each video a query and all its captions
correct. Logged: ``train/loss``; ``val/`` and ``test/`` ``t2v_R@1`` ... ``v2t_MeanR``
and ``rsum`` (the sum of the six recalls, the default monitor); at test also the chance
recalls (``test/chance_t2v_R@1``...). After the test the test split is ranked again with
the words of each caption shuffled (Chimera's EX2; ``test_shuffled_words`` in results.json).

Under DDP (``trainer.devices > 1``) each process embeds its share of every global batch
and gathers the others' embeddings with their gradients (:mod:`polyfuse.tasks.ranking.gather`),
so the loss ranks against the negatives of the whole batch and equals one process's;
at evaluation each process embeds its share of the captions and videos and the metric's
states are gathered (:class:`~polyfuse.metrics.retrieval.TextVideoRetrieval`), so every
process ranks the whole split and logs the numbers of one process.

Validation and test compute in float32 whatever ``trainer.precision`` is (the
bf16-mixed autocast covers the training steps only).

Configuration: the ``retrieval`` section (:class:`RetrievalConfig`) beside the shared
``seed``, ``optim.lr``, ``optim.weight_decay``, ``trainer.*``, ``data.batch_size``,
``data.eval_batch_size`` and ``model.options.man`` (MAN's constructor options).
``model.fusion`` names a module of :mod:`polyfuse.nn`; the video fusions here (mean of
experts, collaborative gating, and MAN as a branch beside them) are not all such
modules, so the video fusion is ``retrieval.fusion``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import lightning as L
import torch
from pydantic import Field, model_validator
from torch import Tensor
from torch.utils.data import DataLoader

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.functional.contrastive import info_nce_loss, max_margin_ranking_loss
from polyfuse.metrics.retrieval import (
    TextVideoRetrieval,
    query_targets,
    recall_sum,
    retrieval_ranks,
    text_video_retrieval,
)
from polyfuse.nn.models.retrieval import VIDEO_FUSIONS, RetrievalModel
from polyfuse.progress import Stopwatch, progress_bar, run_display, say
from polyfuse.tasks import building
from polyfuse.tasks.ranking.data import (
    ONE_PROCESS,
    PARTS,
    RetrievalDataModule,
    RetrievalSourceConfig,
    Shard,
    corpus_vocabulary,
    encode_captions,
    load_corpus,
    shuffle_words,
)
from polyfuse.tasks.ranking.gather import gather_rows
from polyfuse.tasks.ranking.groups import own_group, parameter_groups, write_rank_records
from polyfuse.tasks.registry import TaskData, TaskSpec, register_task

__all__ = ["RetrievalConfig", "RetrievalSpec", "RetrievalTask", "legacy_checkpoint", "rank_metrics", "split_man_branch"]

#: The columns of the retrieval tables (docs/RESULTS.md).
METRIC_COLUMNS = ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR", "v2t_R@1", "v2t_R@5", "v2t_R@10", "v2t_MedR")
#: The splits an evaluation may name, engine name -> part of the corpus.
SPLITS = {"train": "train", "valid": "val", "val": "val", "test": "test", "all": "all"}


class RetrievalConfig(RetrievalSourceConfig):
    """Retrieval over experts (task.type retrieval): the corpus, the text side, the video fusion, the loss."""

    fusion: Literal[VIDEO_FUSIONS] = Field(  # type: ignore[valid-type]
        "man", description="video fusion: " + " | ".join(VIDEO_FUSIONS) + " (MAN's options: model.options.man)")
    text: Literal["minilm", "glove", "bow"] = Field(
        "minilm", description="text encoder: minilm | glove (word_vectors) | bow (word counts, synthetic data)")
    word_vectors: str | None = Field(None, description="text: glove: a GloVe-format vectors file (relative to the config file)")
    embed_dim: Annotated[int, Field(ge=1)] = Field(256, description="joint embedding size D")
    hidden_dim: Annotated[int, Field(ge=1)] = Field(64, description="hidden size of MAN / Concat")
    loss: Literal["margin", "infonce"] = Field(
        "margin", description="margin (bidirectional max-margin, hardest negatives) | infonce")
    margin: Annotated[float, Field(ge=0.0)] = Field(0.2, description="loss: margin: the margin")
    temperature: Annotated[float, Field(gt=0.0)] = Field(0.05, description="loss: infonce: the temperature")
    text_lr: Annotated[float, Field(gt=0.0)] | None = Field(
        None, description="fine-tune the text encoder (minilm, glove) at this learning rate (null: frozen)")
    man_lr: Annotated[float, Field(gt=0.0)] | None = Field(
        None, description="gating+man, mean+man: learning rate of MAN's video branch (null: optim.lr)")
    man_layer_norm: bool | None = Field(
        None, description="layer-normalise MAN's fused vector (null: on for gating+man and mean+man, off for man)")
    man_zero_init: bool | None = Field(
        None, description="mean+man: MAN's branch starts at zero (null: on for mean+man; docs/RETRIEVAL.md)")
    chunk_size: Annotated[int, Field(ge=1)] = Field(1024, description="queries ranked at a time (memory: chunk x gallery)")
    shuffled_test: bool = Field(True, description="after the test, rank the test split again with each caption's words shuffled (EX2)")

    @model_validator(mode="after")
    def _consistent(self) -> RetrievalConfig:
        if self.man_lr is not None and self.fusion not in ("gating+man", "mean+man"):
            raise ValueError(f"retrieval.man_lr applies to MAN as a branch (gating+man, mean+man), not to {self.fusion}")
        if self.man_zero_init and self.fusion != "mean+man":
            raise ValueError(f"retrieval.man_zero_init applies to the fusion mean+man only, not {self.fusion}")
        if self.text == "bow" and self.text_lr is not None:
            raise ValueError("retrieval.text_lr: a bag of words has nothing to fine-tune")
        if (self.text == "glove") != bool(self.word_vectors):
            raise ValueError("retrieval.word_vectors goes with text: glove, and text: glove needs it")
        return self


def split_man_branch(groups: list[dict], model: RetrievalModel, man_lr: float | None) -> list[dict]:
    """``groups`` with the parameters of MAN's video branch (MAN, its output map, the absent
    steps) in their own group at ``man_lr``; as they are without ``man_lr``. Only where
    MAN is a branch beside another fusion."""
    if man_lr is None:
        return groups
    video = model.video
    if video.fusion_name not in ("gating+man", "mean+man"):
        raise ValueError(f"man_lr applies to MAN as a branch (gating+man, mean+man), not to {video.fusion_name}")
    branch = [*video.fusion.parameters(), *video.fused_output.parameters(), *video.absent.parameters()]
    return own_group(groups, branch, lr=man_lr)


def rank_metrics(texts: Tensor, videos: Tensor, caption_videos: Sequence[str], video_ids: Sequence[str], *,
                 chunk_size: int = 1024, chance: bool = False) -> dict[str, float]:
    """R@1/5/10, MedR, MeanR of text-to-video (``t2v_``) and video-to-text (``v2t_``) over
    (C, D) caption and (N, D) video embeddings (:func:`~polyfuse.metrics.retrieval.text_video_retrieval`),
    ``rsum`` the sum of the six recalls, and with ``chance`` the chance recalls."""
    row_of = {video: i for i, video in enumerate(video_ids)}
    caption_video = torch.tensor([row_of[v] for v in caption_videos], dtype=torch.long)
    out = text_video_retrieval(caption_video, texts=texts, videos=videos, chunk_size=chunk_size, chance=chance)
    out["rsum"] = recall_sum(out)
    return out


class RetrievalTask(L.LightningModule):
    """Training and ranking of a :class:`~polyfuse.nn.models.retrieval.RetrievalModel` (module docstring).

    ``text_encoder``: the encoder fine-tuned with the model (``text_lr``), a submodule so
    that its weights are in the checkpoint; None when the captions come as vectors."""

    def __init__(self, model: RetrievalModel, *, lr: float = 1e-3, weight_decay: float = 1e-4,
                 loss: str = "margin", margin: float = 0.2, temperature: float = 0.05,
                 text_lr: float | None = None, man_lr: float | None = None, text_encoder=None,
                 chunk_size: int = 1024) -> None:
        super().__init__()
        if loss not in ("margin", "infonce"):
            raise ValueError(f"unknown loss {loss!r}; expected 'margin' or 'infonce'")
        if text_lr is not None and text_encoder is None:
            raise ValueError("text_lr is set but no text encoder was given to fine-tune")
        self.model = model
        self.text_encoder = text_encoder
        self.lr, self.weight_decay, self.text_lr, self.man_lr = float(lr), float(weight_decay), text_lr, man_lr
        self.loss_name, self.margin, self.temperature = loss, float(margin), float(temperature)
        self.chunk_size = int(chunk_size)
        # whole-split ranking, per stage (the chance recalls at test only)
        self.stage_metrics = torch.nn.ModuleDict({"val": TextVideoRetrieval(chunk_size=self.chunk_size, chance=False),
                                                  "test": TextVideoRetrieval(chunk_size=self.chunk_size, chance=True)})

    # ---- steps ----------------------------------------------------------------------
    def _sentences(self, batch: Mapping[str, Any]) -> Tensor:
        if batch.get("text") is not None:
            return batch["text"]
        if self.text_encoder is None:
            raise ValueError("the batch carries captions as strings but the task has no text encoder")
        return self.text_encoder(list(batch["captions"])).sentence

    def _loss(self, scores: Tensor) -> Tensor:
        positives = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
        if self.loss_name == "margin":
            return max_margin_ranking_loss(scores, positives, margin=self.margin)
        return info_nce_loss(scores, positives, temperature=self.temperature)

    def training_step(self, batch: Mapping[str, Any], batch_index: int) -> Tensor:
        """The loss of the global batch: under DDP this process's share is embedded here
        and the others' gathered with their gradients (the same loss on every process)."""
        texts = self.model.embed_texts(self._sentences(batch))
        videos = self.model.embed_videos(batch["features"], batch["masks"], batch["present"])
        sizes = batch.get("shard_sizes") or [len(batch["present"])]
        texts, videos = gather_rows(self, texts, sizes), gather_rows(self, videos, sizes)  # (B, D) each
        loss = self._loss(texts @ videos.T)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=sum(sizes), sync_dist=True)
        return loss

    @torch.no_grad()
    def embed_chunk(self, chunk: Mapping[str, Any]) -> dict[str, Any]:
        """The embeddings of an evaluation chunk's captions and videos (None where the chunk
        has none), in float32, with their rows."""
        with torch.autocast(device_type=self.device.type, enabled=False):
            texts = self.model.embed_texts(self._sentences(chunk).float()) if len(chunk["caption_rows"]) else None
            videos = (self.model.embed_videos([x.float() for x in chunk["features"]], chunk["masks"], chunk["present"])
                      if len(chunk["video_rows"]) else None)
        return {"texts": texts, "videos": videos, "caption_rows": chunk["caption_rows"],
                "caption_video": chunk["caption_video"], "video_rows": chunk["video_rows"]}

    def _update(self, metric: TextVideoRetrieval, chunk: Mapping[str, Any]) -> None:
        embedded = self.embed_chunk(chunk)
        captions = {} if embedded["texts"] is None else {
            "caption_rows": embedded["caption_rows"], "caption_video": embedded["caption_video"],
            "texts": embedded["texts"]}
        videos = {} if embedded["videos"] is None else {"videos": embedded["videos"],
                                                         "video_rows": embedded["video_rows"]}
        metric.update(**captions, **videos)

    @staticmethod
    def _compute(metric: TextVideoRetrieval) -> dict[str, float]:
        values = metric.compute()
        metric.reset()
        values["rsum"] = recall_sum(values)
        return values

    def validation_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self._update(self.stage_metrics["val"], batch)

    def on_validation_epoch_end(self) -> None:
        # the same numbers on every process (the states are gathered): max keeps them exact
        self.log_dict({f"val/{k}": v for k, v in self._compute(self.stage_metrics["val"]).items()}, sync_dist=True,
                      reduce_fx="max")

    def test_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self._update(self.stage_metrics["test"], batch)

    def on_test_epoch_end(self) -> None:
        self.log_dict({f"test/{k}": v for k, v in self._compute(self.stage_metrics["test"]).items()}, sync_dist=True,
                      reduce_fx="max")

    def predict_step(self, batch: Mapping[str, Any], batch_index: int) -> dict[str, Any]:
        return self.embed_chunk(batch)

    def evaluate(self, loader: DataLoader, *, chance: bool = True) -> dict[str, float]:
        """The metrics of one split's chunks, outside a Trainer (in eval mode, float32), in
        this process alone (nothing is gathered: the loader holds the whole split)."""
        was_training = self.training
        self.eval()
        metric = TextVideoRetrieval(chunk_size=self.chunk_size, chance=chance, sync_on_compute=False)
        for chunk in loader:
            self._update(metric, chunk)
        self.train(was_training)
        return self._compute(metric)


    # ---- optimiser ------------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        groups = split_man_branch(parameter_groups(self.model, self.text_encoder, self.text_lr), self.model,
                                  self.man_lr)
        return torch.optim.AdamW(groups, lr=self.lr, weight_decay=self.weight_decay)


# ---- data ----------------------------------------------------------------------------------
@dataclass
class RetrievalPrepared:
    """A retrieval run's data: the corpus's parts, their caption vectors (None where the
    encoder is fine-tuned: batches then carry the captions), the text settings."""

    parts: dict[str, RetrievalCorpus]
    vectors: dict[str, Tensor | None]
    text_dim: int
    vocabulary: list[str] | None
    references: dict[str, float] = field(default_factory=dict)


def _video_batch(corpus: RetrievalCorpus, rows: Tensor) -> dict[str, Any]:
    experts = list(corpus.experts.values())
    return {"features": [e.features[rows] for e in experts], "masks": [e.mask[rows] for e in experts],
            "present": torch.stack([e.present[rows] for e in experts], dim=1)}


class _Batches:
    """The collate function of :class:`RetrievalDataModule` for this task: video tensors
    of the rows, and caption vectors (or caption strings when the encoder is fine-tuned)."""

    def __init__(self, prepared: RetrievalPrepared) -> None:
        self.prepared = prepared
        self._rows: dict[str, Tensor] = {}

    def _captions(self, part: str, rows: list[int]) -> dict[str, Any]:
        corpus, vectors = self.prepared.parts[part], self.prepared.vectors.get(part)
        return {"text": vectors[rows] if vectors is not None else None,
                "captions": [corpus.captions[i] for i in rows]}

    def __call__(self, part: str, batch, shard: Shard = ONE_PROCESS) -> dict[str, Any]:
        corpus = self.prepared.parts[part]
        if isinstance(batch, list):  # training: the global batch's (video row, caption row) pairs
            start, stop = shard.bounds(len(batch))
            pairs = batch[start:stop]  # this process's share
            rows = torch.tensor([v for v, _ in pairs])
            return {**_video_batch(corpus, rows), **self._captions(part, [c for _, c in pairs]),
                    "shard_sizes": shard.sizes(len(batch))}
        videos, captions = batch["video_rows"], batch["caption_rows"]
        return {**_video_batch(corpus, videos), **self._captions(part, captions.tolist()), "video_rows": videos,
                "caption_rows": captions, "caption_video": self._video_row(part)[captions]}

    def _video_row(self, part: str) -> Tensor:
        """(C,) the row of each caption's video in ``part``."""
        if part not in self._rows:
            corpus = self.prepared.parts[part]
            row_of = {video: i for i, video in enumerate(corpus.video_ids)}
            self._rows[part] = torch.tensor([row_of[v] for v in corpus.caption_video], dtype=torch.long)
        return self._rows[part]


def _encoder_of(section: Mapping[str, Any], vocabulary: list[str] | None, *, trainable: bool):
    return building.text_encoder(section["text"], vocabulary, word_vectors=section.get("word_vectors"), trainable=trainable)


def prepare_retrieval(config: Mapping[str, Any], *, cache_dir: Path | None, encoder=None,
                      parts: Sequence[str] = (*PARTS, "test_shuffled"),
                      display: tuple[bool, bool] = (False, False)) -> tuple[RetrievalPrepared, Any]:
    """The parts of the configuration's corpus and their caption vectors (cached by
    content under ``cache_dir``); ``test_shuffled``: the test split with each caption's
    words shuffled (seed 0). Returns the prepared data and the text encoder.

    ``display``: a progress bar of the captions encoded (on a terminal) and a final line
    on stderr saying how many and in how long (:func:`polyfuse.progress.run_display`)."""
    section = config["retrieval"]
    corpus, split = load_corpus(section)
    selected: dict[str, RetrievalCorpus] = {}
    for name in parts:
        if name == "all":
            selected[name] = corpus
        elif name == "test_shuffled":
            test = corpus.subset(split["test"])
            selected[name] = RetrievalCorpus(test.video_ids, test.experts, shuffle_words(test.captions, 0),
                                             test.caption_video)
        else:
            selected[name] = corpus.subset(split[name])
    vocabulary = corpus_vocabulary(corpus) if section["text"] == "bow" else None
    fine_tune = section["text_lr"] is not None
    loading, loaded = Stopwatch(), ""
    if encoder is None:
        encoder = _encoder_of(section, vocabulary, trainable=fine_tune)
        loaded = f"; the encoder loaded in {loading}"
    if fine_tune:  # batches carry the captions; the module's encoder reads them
        vectors: dict[str, Tensor | None] = dict.fromkeys(selected)
        text_dim = int(encoder.hidden_size)
    else:
        show_bar, show_line = display
        encoding, total = Stopwatch(), sum(len(part.captions) for part in selected.values())
        with progress_bar(total=total, show=show_bar, desc="encode captions", unit="caption") as bar:
            vectors = {name: encode_captions(encoder, part.captions, cache_dir=cache_dir, bar=bar)
                       for name, part in selected.items()}
        if show_line and bar.n:  # nothing to say when every vector came from the cache
            cached = f", {total - bar.n} read from the cache" if bar.n < total else ""
            say(f"retrieval: {bar.n} captions of {', '.join(selected)} encoded by {type(encoder).__name__} "
                f"in {encoding}{cached}{loaded}")
        text_dim = int(next(iter(vectors.values())).shape[1])
    references = {}
    source = section.get("source")
    if source is not None and source.startswith("synthetic"):
        from polyfuse.data.synthetic_retrieval import recall_bounds

        references = recall_bounds(corpus.subset(split["test"]))
    return RetrievalPrepared(selected, vectors, text_dim, vocabulary, references), encoder


def _task_data(config: Mapping[str, Any], prepared: RetrievalPrepared) -> TaskData:
    datamodule = RetrievalDataModule(prepared.parts, _Batches(prepared), batch_size=config["data"]["batch_size"],
                                     eval_batch_size=config["data"]["eval_batch_size"], seed=config["seed"]) \
        if "train" in prepared.parts else _EvalOnly(prepared, config["data"]["eval_batch_size"])
    samples = {name: len(part.captions) for name, part in prepared.parts.items()}
    steps = len(datamodule.sampler) if "train" in prepared.parts else 1
    return TaskData(datamodule, prepared, samples, steps)


class _EvalOnly(RetrievalDataModule):
    """The loaders of a checkpoint's evaluation: no training part."""

    def __init__(self, prepared: RetrievalPrepared, eval_batch_size: int) -> None:
        L.LightningDataModule.__init__(self)
        self.parts, self.collate = prepared.parts, _Batches(prepared)
        self.batch_size, self.eval_batch_size, self.seed = 2, int(eval_batch_size), 0


def _model(config: Mapping[str, Any], text_dim: int, expert_dims: Sequence[int]) -> RetrievalModel:
    section = config["retrieval"]
    options = dict((config.get("model") or {}).get("options", {}).get("man", {})) \
        if "man" in section["fusion"].split("+") else {}
    if "man" in section["fusion"].split("+"):
        options.setdefault("seed", int(config["seed"]))
    return RetrievalModel(text_dim, list(expert_dims), embed_dim=section["embed_dim"], fusion=section["fusion"],
                          hidden_dim=section["hidden_dim"], fusion_options=options,
                          man_layer_norm=section["man_layer_norm"], man_zero_init=section["man_zero_init"])


def _task(config: Mapping[str, Any], model: RetrievalModel, encoder) -> RetrievalTask:
    section = config["retrieval"]
    fine_tune = section["text_lr"] is not None
    return RetrievalTask(model, lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
                         loss=section["loss"], margin=section["margin"], temperature=section["temperature"],
                         text_lr=section["text_lr"], man_lr=section["man_lr"],
                         text_encoder=encoder if fine_tune else None, chunk_size=section["chunk_size"])


def cache_dir_of(config: Mapping[str, Any]) -> Path:
    """Where caption vectors are cached: ``<output_dir>/.cache`` (files named by content)."""
    return Path(config.get("output_dir") or "runs") / ".cache"


#: The entries of a checkpoint of ``polyfuse retrieval train`` before 0.3.x's engine path.
LEGACY_KEYS = ("state", "settings", "text_dim", "expert_dims")


def legacy_checkpoint(saved: Mapping[str, Any], where: str = "the checkpoint") -> tuple[dict[str, Any], dict[str, Any]]:
    """(state_dict, extras) of a ``seed<N>.safetensors`` written by ``polyfuse retrieval train``
    before the engine path (weights under ``state``, settings as a dict), as the engine's
    checkpoints hold them: the model's keys under ``model.``, the settings as a
    ``retrieval`` section. A layout key the file lacks takes the value of the polyfuse
    that wrote it: ``man_layer_norm`` None (off for MAN alone), ``man_zero_init`` False
    (mean+man's two unit vectors weighed equally, the only layout there was)."""
    missing = [key for key in LEGACY_KEYS if key not in saved]
    if missing:
        raise ValueError(f"{where}: not a retrieval checkpoint of polyfuse (it lacks {', '.join(missing)})")
    old = {"man_zero_init": False, **saved["settings"]}
    text = saved.get("text", "minilm")
    if text not in ("minilm", "bow"):
        raise ValueError(f"{where}: trained with the word vectors {text}; retrain it with polyfuse train")
    if old.get("text_lr") is not None:
        raise ValueError(f"{where}: its text encoder was fine-tuned; retrain it with polyfuse train")
    section = RetrievalConfig(
        source="legacy", fusion=old["fusion"], text=text, embed_dim=old["embed_dim"], hidden_dim=old["hidden_dim"],
        loss=old.get("loss", "margin"), margin=old.get("margin", 0.2), temperature=old.get("temperature", 0.05),
        man_layer_norm=old.get("man_layer_norm"), man_zero_init=old["man_zero_init"] or None,
    ).model_dump()
    if old["fusion"] == "mean+man" and not old["man_zero_init"]:
        section["man_zero_init"] = False
    config = {"seed": 0, "task": {"type": "retrieval"}, "retrieval": section,
              "model": {"options": {"man": dict(old.get("fusion_options") or {})}},
              "optim": {"lr": old.get("lr", 1e-3), "weight_decay": old.get("weight_decay", 1e-4)},
              "data": {"batch_size": old.get("batch_size", 32), "eval_batch_size": 256}}
    extras = {"config": config, "modalities": [], "input_dims": list(saved["expert_dims"]),
              "label_info": {"text": text, "text_dim": int(saved["text_dim"]), "vocabulary": None}, "stats": {}}
    return {f"model.{k}": v for k, v in saved["state"].items()}, extras


@register_task
class RetrievalSpec(TaskSpec):
    """``task.type: retrieval`` (see the module docstring)."""

    name = "retrieval"
    config_sections: ClassVar[dict[str, type]] = {"retrieval": RetrievalConfig}
    sections = ("retrieval",)
    required_sections = ("retrieval",)
    model_sections = ("retrieval", "model")
    default_monitor = ("val/rsum", "max")
    prediction_suffix = ".csv"
    reads_own_files = True
    path_keys = ("retrieval.source", "retrieval.captions", "retrieval.word_vectors")
    path_mappings = ("retrieval.experts", "retrieval.splits")

    def data_files(self, config: Mapping[str, Any]) -> list[Path]:
        section = config["retrieval"]
        files = [section.get("source"), section.get("captions"), section.get("word_vectors"),
                 *(section.get("experts") or {}).values(), *(section.get("splits") or {}).values()]
        return [Path(f) for f in files if f and not str(f).startswith("synthetic") and Path(f).is_file()]

    def build_data(self, config: Mapping[str, Any]) -> TaskData:
        prepared, encoder = prepare_retrieval(config, cache_dir=cache_dir_of(config),
                                              parts=(*PARTS, "test_shuffled") if config["retrieval"]["shuffled_test"] else PARTS,
                                              display=run_display(config))
        data = _task_data(config, prepared)
        data.datamodule.text_encoder = encoder  # the encoder the module fine-tunes (text_lr)
        return data

    def build_module(self, config: Mapping[str, Any], data: TaskData) -> RetrievalTask:
        prepared: RetrievalPrepared = data.prepared
        expert_dims = [e.dim for e in prepared.parts["train"].experts.values()]
        model = _model(config, prepared.text_dim, expert_dims)
        return _task(config, model, getattr(data.datamodule, "text_encoder", None))

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData) -> dict[str, Any]:
        prepared: RetrievalPrepared = data.prepared
        train = prepared.parts["train"]
        return {"config": dict(config), "modalities": list(train.experts),
                "input_dims": [e.dim for e in train.experts.values()],
                "label_info": {"text": config["retrieval"]["text"], "text_dim": prepared.text_dim,
                               "vocabulary": prepared.vocabulary},
                "stats": {}}

    def after_test(self, module: RetrievalTask, data: TaskData, run_dir: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "test_shuffled" in data.prepared.parts:
            out["test_shuffled_words"] = module.evaluate(data.datamodule.loader("test_shuffled"))
        if data.prepared.references:
            out["references"] = data.prepared.references
        return out

    # ---- a checkpoint, applied ----------------------------------------------------------
    def module_from_extras(self, extras: Mapping[str, Any]) -> RetrievalTask:
        config, info = extras["config"], extras["label_info"]
        section = config["retrieval"]
        encoder = None
        if section["text_lr"] is not None:
            encoder = _encoder_of(section, info.get("vocabulary"), trainable=True)
        return _task(config, _model(config, int(info["text_dim"]), extras["input_dims"]), encoder)

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        shuffle_words: bool = False) -> TaskData:
        if source is not None or modalities:
            raise ValueError("retrieval evaluates on its configuration's corpus: --data and --modalities do not apply")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        config = extras["config"]
        part = SPLITS[split]
        parts = ("test_shuffled",) if shuffle_words and part == "test" else (part,)
        if shuffle_words and part != "test":
            raise ValueError("shuffled words are drawn for the test split only")
        # fine-tuned (text_lr): the chunks carry the captions, which the module's own encoder reads
        prepared, _ = prepare_retrieval(config, cache_dir=cache_dir_of(config), parts=parts)
        data = _task_data(config, prepared)
        data.split_part = parts[0]
        return data

    def loaders(self, data: TaskData, split: str) -> dict[str, DataLoader]:
        part = getattr(data, "split_part", None) or SPLITS.get(split, split)
        return {part: data.datamodule.loader(part)}

    def loader(self, data: TaskData, split: str) -> DataLoader:
        """The one evaluation loader of ``split``."""
        (loader,) = self.loaders(data, split).values()
        return loader

    def records(self, module: RetrievalTask, outputs: Mapping[str, Sequence[Any]], data: TaskData,
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One record per caption of the split: the caption, its video, the rank of that
        video among the split's and the top five videos."""
        ((part_name, chunks),) = outputs.items()
        part = data.prepared.parts[part_name]
        texts = torch.cat([o["texts"] for o in chunks if o["texts"] is not None])
        videos = torch.cat([o["videos"] for o in chunks if o["videos"] is not None])
        targets = query_targets(part.caption_video, part.video_ids)
        ranks = retrieval_ranks(texts, videos, targets, chunk_size=module.chunk_size)
        top = (texts @ videos.T).topk(min(5, len(part.video_ids)), dim=1).indices
        return [{"caption": part.captions[i], "video_id": part.caption_video[i], "rank": int(ranks[i]),
                 "top5": " ".join(part.video_ids[j] for j in top[i].tolist())} for i in range(len(part.captions))]

    def sentence_vectors(self, module: RetrievalTask, extras: Mapping[str, Any], captions: Sequence[str]) -> Tensor:
        """(C, d_t) sentence vectors of free text, through the checkpoint's text encoder (its
        fine-tuned one when the module holds it)."""
        encoder = module.text_encoder or _encoder_of(extras["config"]["retrieval"],
                                                     extras["label_info"].get("vocabulary"), trainable=False)
        with torch.no_grad():
            return encoder(list(captions)).sentence

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        write_rank_records(records, path)

    def attention_figures(self, module: RetrievalTask, extras: Mapping[str, Any], out: Path, *, split: str,
                          sample: int, source: str | None, modalities: Sequence[str] | None) -> list[Path]:
        """MAN's marginal attention over each expert's steps for the ``sample``-th video of
        ``split`` (an absent expert shows its one learned absent step)."""
        from polyfuse.nn import MAN
        from polyfuse.tasks.attention_figure import draw_fusion_attention, fusion_attention

        encoder = module.model.video
        if not isinstance(getattr(encoder, "fusion", None), MAN):
            with_man = [name for name in VIDEO_FUSIONS if "man" in name.split("+")]
            raise ValueError(f"the retrieval fusion {encoder.fusion_name} has no attention to plot; "
                             f"those with MAN ({', '.join(with_man)}) have")
        data = self.checkpoint_data(extras, split=split, source=source, modalities=modalities)
        corpus = data.prepared.parts[data.split_part]
        if not 0 <= sample < len(corpus.video_ids):
            raise ValueError(f"sample {sample} outside the {len(corpus.video_ids)} videos of {split!r}")
        batch = _video_batch(corpus, torch.tensor([sample]))
        with torch.no_grad():
            inputs, masks = encoder.joint_inputs(batch["features"], batch["masks"], batch["present"])
            names = [name if bool(here) else f"{name} (absent)"
                     for name, here in zip(corpus.experts, batch["present"][0], strict=True)]
            attention = fusion_attention(encoder.fusion, inputs, masks, names)
        video = corpus.video_ids[sample]
        caption = next((c for c, v in zip(corpus.captions, corpus.caption_video, strict=True) if v == video), "")
        title = f"{split} video {sample} ({video}): MAN over the experts; a caption: {caption}"
        return [draw_fusion_attention(attention, out, title=title)]
