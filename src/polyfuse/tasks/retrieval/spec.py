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
``seed``, ``optim.*``, ``trainer.*``, ``data.batch_size``,
``data.eval_batch_size`` and ``model.options.man`` (MAN's constructor options). ``model.fusion`` names the video
fusion, one of :data:`~polyfuse.nn.models.retrieval.VIDEO_FUSIONS` (the spec's
``fusions``): mean of experts, collaborative gating, concatenation, MAN, and MAN as a
branch beside the mean or the gating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.functional.contrastive import info_nce_loss, max_margin_ranking_loss
from polyfuse.metrics.retrieval import TextVideoRetrieval, recall_sum, text_video_retrieval
from polyfuse.nn.models.retrieval import VIDEO_FUSIONS, RetrievalModel
from polyfuse.progress import Stopwatch, progress_bar, run_display, say
from polyfuse.sizes import SizeInt
from polyfuse.tasks import building
from polyfuse.tasks.optim import OptimSettings, build_optimizer
from polyfuse.tasks.ranking.data import (
    CORPUS_SPLITS,
    ONE_PROCESS,
    RetrievalSourceConfig,
    Shard,
    corpus_vocabulary,
    encode_captions,
    load_corpus,
    video_batch,
)
from polyfuse.tasks.ranking.gather import gather_rows
from polyfuse.tasks.ranking.groups import own_group, parameter_groups
from polyfuse.tasks.ranking.module import RankingTask
from polyfuse.tasks.ranking.spec import (
    SHUFFLED,
    RankingSpec,
    cache_dir_of,
    ranking_data,
    select_splits,
)
from polyfuse.tasks.registry import TaskData, register_task

__all__ = ["RetrievalConfig", "RetrievalSpec", "RetrievalTask", "rank_metrics", "split_man_branch"]


class RetrievalConfig(RetrievalSourceConfig):
    """Retrieval over experts (task.type retrieval): the corpus, the text side, the video fusion, the loss."""

    text: Literal["minilm", "glove", "bow"] = Field(
        "minilm", description="text encoder: minilm | glove (word_vectors) | bow (word counts, synthetic data)")
    word_vectors: str | None = Field(None, description="text: glove: a GloVe-format vectors file (relative to the config file)")
    embed_dim: SizeInt = Field(256, description="joint embedding size D")
    hidden_dim: SizeInt = Field(64, description="hidden size of MAN / Concat")
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
    renormalize_weights: bool = Field(
        False, description="gating, gating+man: renormalise the mixture weights over the experts each video has, "
        "as collaborative experts does (off: an absent expert adds 0 to the score, the weights stay as they are)")
    chunk_size: Annotated[int, Field(ge=1)] = Field(1024, description="queries ranked at a time (memory: chunk x gallery)")
    shuffled_test: bool = Field(True, description="after the test, rank the test split again with each caption's words shuffled (EX2)")

    @model_validator(mode="after")
    def _consistent(self) -> RetrievalConfig:
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
                 chunk_size: int = 1024, chance: bool = False, similarity=None) -> dict[str, float]:
    """R@1/5/10, MedR, MeanR of text-to-video (``t2v_``) and video-to-text (``v2t_``) over
    (C, D) caption and (N, D) video embeddings (:func:`~polyfuse.metrics.retrieval.text_video_retrieval`),
    ``rsum`` the sum of the six recalls, and with ``chance`` the chance recalls. ``similarity``:
    the model's scorer (:meth:`~polyfuse.nn.models.retrieval.RetrievalModel.score_function`; None: dot products)."""
    row_of = {video: i for i, video in enumerate(video_ids)}
    caption_video = torch.tensor([row_of[v] for v in caption_videos], dtype=torch.long)
    out = text_video_retrieval(caption_video, texts=texts, videos=videos, chunk_size=chunk_size, chance=chance,
                               similarity=similarity)
    out["rsum"] = recall_sum(out)
    return out


class RetrievalTask(RankingTask):
    """Training and ranking of a :class:`~polyfuse.nn.models.retrieval.RetrievalModel` (module docstring).

    ``text_encoder``: the encoder fine-tuned with the model (``text_lr``), a submodule so
    that its weights are in the checkpoint; None when the captions come as vectors."""

    def __init__(self, model: RetrievalModel, *, lr: float = 1e-3, weight_decay: float = 1e-4,
                 loss: str = "margin", margin: float = 0.2, temperature: float = 0.05,
                 text_lr: float | None = None, man_lr: float | None = None, text_encoder=None,
                 chunk_size: int = 1024, optim: OptimSettings | None = None) -> None:
        super().__init__()
        self.optim_settings = optim if optim is not None else OptimSettings()  # optimiser and schedule
        if loss not in ("margin", "infonce"):
            raise ValueError(f"unknown loss {loss!r}; expected 'margin' or 'infonce'")
        if text_lr is not None and text_encoder is None:
            raise ValueError("text_lr is set but no text encoder was given to fine-tune")
        self.model = model
        self.text_encoder = text_encoder
        self.lr, self.weight_decay, self.text_lr, self.man_lr = float(lr), float(weight_decay), text_lr, man_lr
        self.loss_name, self.margin, self.temperature = loss, float(margin), float(temperature)
        self.chunk_size = int(chunk_size)
        self.start_split(chance=False, gather=False)

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
        loss = self._loss(self.model.similarity(texts, videos))
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

    # ---- ranking a split (polyfuse.tasks.ranking.module) -------------------------------
    def start_split(self, *, chance: bool, gather: bool) -> None:
        metric = TextVideoRetrieval(chunk_size=self.chunk_size, chance=chance, sync_on_compute=gather,
                                    similarity=self.model.score_function())
        object.__setattr__(self, "_split", metric.to(self.device))  # not a submodule: no state of the model

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        embedded = self.embed_chunk(chunk)
        captions = {} if embedded["texts"] is None else {
            "caption_rows": embedded["caption_rows"], "caption_video": embedded["caption_video"],
            "texts": embedded["texts"]}
        videos = {} if embedded["videos"] is None else {"videos": embedded["videos"],
                                                         "video_rows": embedded["video_rows"]}
        self._split.update(**captions, **videos)

    def split_metrics(self) -> dict[str, float]:
        values = self._split.compute()
        self._split.reset()
        return values

    def predict_step(self, batch: Mapping[str, Any], batch_index: int) -> dict[str, Any]:
        return self.embed_chunk(batch)

    # ---- optimiser ------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        """``optim``'s optimiser and schedule (:func:`~polyfuse.tasks.optim.build_optimizer`) over the
        model's parameters at ``optim.lr`` and ``optim.weight_decay`` (biases included), the fine-tuned
        text encoder's at ``text_lr`` and MAN's branch at ``man_lr``; a schedule scales each group's rate."""
        groups = split_man_branch(parameter_groups(self.model, self.text_encoder, self.text_lr), self.model,
                                  self.man_lr)
        return build_optimizer(groups, self.optim_settings, lr=self.lr, weight_decay=self.weight_decay)


# ---- data ----------------------------------------------------------------------------------
@dataclass
class RetrievalData:
    """A retrieval run's data: the corpus's splits, their caption vectors (None where the
    encoder is fine-tuned: batches then carry the captions), the text settings."""

    splits: dict[str, RetrievalCorpus]
    vectors: dict[str, Tensor | None]
    text_dim: int
    vocabulary: list[str] | None
    references: dict[str, float] = field(default_factory=dict)


class _Batches:
    """The collate function of :class:`RetrievalDataModule` for this task: video tensors
    of the rows, and caption vectors (or caption strings when the encoder is fine-tuned)."""

    def __init__(self, prepared: RetrievalData) -> None:
        self.prepared = prepared
        self._rows: dict[str, Tensor] = {}

    def _captions(self, split_name: str, rows: list[int]) -> dict[str, Any]:
        corpus, vectors = self.prepared.splits[split_name], self.prepared.vectors.get(split_name)
        return {"text": vectors[rows] if vectors is not None else None,
                "captions": [corpus.captions[i] for i in rows]}

    def __call__(self, split_name: str, batch, shard: Shard = ONE_PROCESS) -> dict[str, Any]:
        corpus = self.prepared.splits[split_name]
        if isinstance(batch, list):  # training: the global batch's (video row, caption row) pairs
            start, stop = shard.bounds(len(batch))
            pairs = batch[start:stop]  # this process's share
            rows = torch.tensor([v for v, _ in pairs])
            return {**video_batch(corpus, rows), **self._captions(split_name, [c for _, c in pairs]),
                    "shard_sizes": shard.sizes(len(batch))}
        videos, captions = batch["video_rows"], batch["caption_rows"]
        return {**video_batch(corpus, videos), **self._captions(split_name, captions.tolist()), "video_rows": videos,
                "caption_rows": captions, "caption_video": self._video_row(split_name)[captions]}

    def _video_row(self, split_name: str) -> Tensor:
        """(C,) the row of each caption's video in ``split_name``."""
        if split_name not in self._rows:
            corpus = self.prepared.splits[split_name]
            row_of = {video: i for i, video in enumerate(corpus.video_ids)}
            self._rows[split_name] = torch.tensor([row_of[v] for v in corpus.caption_video], dtype=torch.long)
        return self._rows[split_name]


def _encoder_of(section: Mapping[str, Any], vocabulary: list[str] | None, *, trainable: bool):
    return building.text_encoder(section["text"], vocabulary, word_vectors=section.get("word_vectors"), trainable=trainable)


def prepare_retrieval(config: Mapping[str, Any], *, cache_dir: Path | None, encoder=None,
                      split_names: Sequence[str] = (*CORPUS_SPLITS, SHUFFLED),
                      display: tuple[bool, bool] = (False, False)) -> tuple[RetrievalData, Any]:
    """The splits ``split_names`` of the configuration's corpus and their caption vectors (cached by
    content under ``cache_dir``); ``test_shuffled``: the test split with each caption's
    words shuffled (seed 0). Returns the prepared data and the text encoder.

    ``display``: a progress bar of the captions encoded (on a terminal) and a final line
    on stderr saying how many and in how long (:func:`polyfuse.progress.run_display`)."""
    section = config["retrieval"]
    corpus, split = load_corpus(section)
    selected = select_splits(corpus, split, split_names)
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
        encoding, total = Stopwatch(), sum(len(split_name.captions) for split_name in selected.values())
        with progress_bar(total=total, show=show_bar, desc="encode captions", unit="caption") as bar:
            vectors = {name: encode_captions(encoder, split_name.captions, cache_dir=cache_dir, bar=bar)
                       for name, split_name in selected.items()}
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
    return RetrievalData(selected, vectors, text_dim, vocabulary, references), encoder


def _model(config: Mapping[str, Any], text_dim: int, expert_dims: Sequence[int]) -> RetrievalModel:
    section, fusion = config["retrieval"], config["model"]["fusion"]
    options = dict(config["model"]["options"].get("man", {})) if "man" in fusion.split("+") else {}
    if "man" in fusion.split("+"):
        options.setdefault("seed", int(config["seed"]))
    return RetrievalModel(text_dim, list(expert_dims), embed_dim=section["embed_dim"], fusion=fusion,
                          hidden_dim=section["hidden_dim"], fusion_options=options,
                          man_layer_norm=section["man_layer_norm"], man_zero_init=section["man_zero_init"],
                          renormalize_weights=bool(section.get("renormalize_weights", False)))


def _task(config: Mapping[str, Any], model: RetrievalModel, encoder) -> RetrievalTask:
    section = config["retrieval"]
    fine_tune = section["text_lr"] is not None
    return RetrievalTask(model, lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
                         loss=section["loss"], margin=section["margin"], temperature=section["temperature"],
                         text_lr=section["text_lr"], man_lr=section["man_lr"],
                         text_encoder=encoder if fine_tune else None, chunk_size=section["chunk_size"],
                         optim=OptimSettings.from_config(config))


@register_task
class RetrievalSpec(RankingSpec):
    """``task.type: retrieval`` (see the module docstring)."""

    name = "retrieval"
    section = "retrieval"
    config_sections: ClassVar[dict[str, type]] = {"retrieval": RetrievalConfig}
    sections = ("retrieval",)
    required_sections = ("retrieval",)
    model_sections = ("retrieval", "model")
    path_keys = ("retrieval.source", "retrieval.captions", "retrieval.word_vectors")
    path_mappings = ("retrieval.experts", "retrieval.splits")
    fusions = VIDEO_FUSIONS

    def check_config(self, config: Any) -> None:
        super().check_config(config)
        fusion, section = config.model.fusion, config.retrieval
        if section.man_lr is not None and fusion not in ("gating+man", "mean+man"):
            raise ValueError(f"retrieval.man_lr applies to MAN as a branch (model.fusion gating+man, mean+man), not to {fusion}")
        if section.man_zero_init and fusion != "mean+man":
            raise ValueError(f"retrieval.man_zero_init applies to model.fusion mean+man only, not {fusion}")
        if section.renormalize_weights and fusion not in ("gating", "gating+man"):
            raise ValueError(f"retrieval.renormalize_weights applies to the mixture weights of model.fusion gating "
                             f"and gating+man, not to {fusion}")

    def build_data(self, config: Mapping[str, Any]) -> TaskData[RetrievalData]:
        split_names = (*CORPUS_SPLITS, SHUFFLED) if config["retrieval"]["shuffled_test"] else CORPUS_SPLITS
        prepared, encoder = prepare_retrieval(config, cache_dir=cache_dir_of(config), split_names=split_names,
                                              display=run_display(config))
        data = ranking_data(config, prepared, _Batches(prepared))
        data.datamodule.text_encoder = encoder  # the encoder the module fine-tunes (text_lr)
        return data

    def build_module(self, config: Mapping[str, Any], data: TaskData[RetrievalData]) -> RetrievalTask:
        prepared: RetrievalData = data.prepared
        expert_dims = [e.dim for e in prepared.splits["train"].experts.values()]
        model = _model(config, prepared.text_dim, expert_dims)
        return _task(config, model, getattr(data.datamodule, "text_encoder", None))

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[RetrievalData]) -> dict[str, Any]:
        prepared: RetrievalData = data.prepared
        train = prepared.splits["train"]
        return {"config": dict(config), "modalities": list(train.experts),
                "input_dims": [e.dim for e in train.experts.values()],
                "label_info": {"text": config["retrieval"]["text"], "text_dim": prepared.text_dim,
                               "vocabulary": prepared.vocabulary},
                "stats": {}}

    def after_test(self, module: RetrievalTask, data: TaskData[RetrievalData], run_dir: Path) -> dict[str, Any]:
        out = super().after_test(module, data, run_dir)
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

    def split_data(self, extras: Mapping[str, Any], split_name: str) -> TaskData[RetrievalData]:
        # fine-tuned (text_lr): the chunks carry the captions, which the module's own encoder reads
        config = extras["config"]
        prepared, _ = prepare_retrieval(config, cache_dir=cache_dir_of(config), split_names=(split_name,))
        return ranking_data(config, prepared, _Batches(prepared))

    def split_scores(self, module: RetrievalTask, outputs: Sequence[Any],
                     corpus: RetrievalCorpus) -> tuple[Tensor, list[str], list[str]]:
        texts = torch.cat([o["texts"] for o in outputs if o["texts"] is not None])
        videos = torch.cat([o["videos"] for o in outputs if o["videos"] is not None])
        return module.model.similarity(texts, videos), list(corpus.caption_video), list(corpus.video_ids)

    def query_scores(self, module: RetrievalTask, extras: Mapping[str, Any], data: TaskData[RetrievalData], text: str,
                     caption: int | None) -> Tensor:
        vectors = data.prepared.vectors.get(data.split)
        if caption is not None and vectors is not None:
            vector = vectors[caption : caption + 1]
        else:
            vector = self.sentence_vectors(module, extras, [text])
        from polyfuse.tasks.retrieval.figure import video_scores

        return video_scores(module.model, data.prepared.splits[data.split], vector)

    def sentence_vectors(self, module: RetrievalTask, extras: Mapping[str, Any], captions: Sequence[str]) -> Tensor:
        """(C, d_t) sentence vectors of free text, through the checkpoint's text encoder (its
        fine-tuned one when the module holds it)."""
        encoder = module.text_encoder or _encoder_of(extras["config"]["retrieval"],
                                                     extras["label_info"].get("vocabulary"), trainable=False)
        with torch.no_grad():
            return encoder(list(captions)).sentence

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
        corpus = data.prepared.splits[data.split]
        if not 0 <= sample < len(corpus.video_ids):
            raise ValueError(f"sample {sample} outside the {len(corpus.video_ids)} videos of {split!r}")
        batch = video_batch(corpus, torch.tensor([sample]))
        with torch.no_grad():
            inputs, masks = encoder.joint_inputs(batch["features"], batch["masks"], batch["present"])
            names = [name if bool(here) else f"{name} (absent)"
                     for name, here in zip(corpus.experts, batch["present"][0], strict=True)]
            attention = fusion_attention(encoder.fusion, inputs, masks, names)
        video = corpus.video_ids[sample]
        caption = next((c for c, v in zip(corpus.captions, corpus.caption_video, strict=True) if v == video), "")
        title = f"{split} video {sample} ({video}): MAN over the experts; a caption: {caption}"
        return [draw_fusion_attention(attention, out, title=title)]
