"""Video captioning (HOCA section 4.4): the Lightning task around a
:class:`~polyfuse.nn.models.captioner.VideoCaptioner`.

:class:`CaptioningTask`: teacher-forced cross-entropy per token (HOCA Eq. 24, label
smoothing optional; the paper uses neither label smoothing nor scheduled sampling,
so teacher forcing is all there is), the optimiser and schedule of ``optim`` (AdamW
by default; the paper's Adam at 1e-4: ``optim.optimizer: adam``); validation logs the teacher-forced
loss; test decodes every test video with beam search (``<unk>`` never generated
unless ``allow_unknown``) and logs BLEU-1..4, METEOR,
ROUGE-L and CIDEr-D (pycocoevalcap) and the loss. Logged keys: ``train/loss``,
``val/loss``, ``test/loss``, ``test/BLEU-4``, ...

Data parallel (``trainer.devices > 1``) gives the numbers of one process. Every process
takes its share of each global batch (:mod:`polyfuse.tasks.captioning.data`); its per-token
mean loss is weighted by its share of the batch's target tokens (times the number of
processes, which DDP's gradient average divides out), so the gradient and the logged
``train/loss`` and ``val/loss`` (Lightning's batch-weighted means, summed over the
processes at the epoch's end) are those of the global batch. At test, each process
decodes its share of the videos; the captions (text: about their bytes per video) and
the loss's sums are gathered once (``all_gather_object``), the caption metrics scored
once on the whole split by process 0 and broadcast, so every process logs the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import lightning as L
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import Tensor, nn

from polyfuse.atomic import atomic_write_text
from polyfuse.data.formats.captioning import UNKNOWN, Vocabulary
from polyfuse.data.formats.word_vectors import (
    MINILM_DIM,
    caption_word_vectors,
    initial_word_embedding,
)
from polyfuse.data.loading import loader_options
from polyfuse.metrics.captioning import CaptionMetrics
from polyfuse.nn.beam_search import Generated, beam_search
from polyfuse.nn.decoding import caption_cross_entropy
from polyfuse.nn.models.captioner import VideoCaptioner
from polyfuse.sizes import SizeInt
from polyfuse.tasks.captioning.data import CaptioningData, CaptioningDataModule, prepare_captioning
from polyfuse.tasks.optim import OptimSettings, build_optimizer
from polyfuse.tasks.registry import TaskData, TaskSpec, register_task
from polyfuse.text import ptb_tokenize

__all__ = [
    "VARIANTS", "CaptioningConfig", "CaptioningSpec", "CaptioningTask", "DecoderConfig",
    "build_captioning_data", "build_captioning_task", "checkpoint_captioning_data", "initialise_word_embeddings",
    "reference_oov", "variant_settings",
]


class CaptioningTask(L.LightningModule):
    """Training, validation and test of a :class:`VideoCaptioner` (see the module docstring)."""

    task_type = "captioning"
    default_monitor = ("val/loss", "min")

    def __init__(
        self, model: VideoCaptioner, vocabulary: Vocabulary, *, lr: float = 1e-3, weight_decay: float = 0.0,
        label_smoothing: float = 0.0, beam_size: int = 5, max_length: int = 20, length_penalty: float = 1.0,
        meteor: bool = True, allow_unknown: bool = False, optim: OptimSettings | None = None,
    ) -> None:
        super().__init__()
        self.optim_settings = optim if optim is not None else OptimSettings()
        self.model = model
        self.vocabulary = vocabulary
        self.allow_unknown = bool(allow_unknown)
        self.lr, self.weight_decay, self.label_smoothing = float(lr), float(weight_decay), float(label_smoothing)
        self.beam_size, self.max_length, self.length_penalty = int(beam_size), int(max_length), float(length_penalty)
        self.meteor = bool(meteor)
        # the tasks' one name for their metrics; captioning scores captions at test only, on
        # one process, after gathering every process's captions (so torchmetrics never syncs it)
        self.stage_metrics = nn.ModuleDict({"test": CaptionMetrics(meteor=self.meteor, sync_on_compute=False)})
        self.references: Mapping[str, Sequence[str]] = {}  # set by the engine before testing
        self.generated: dict[str, str] = {}  # video -> caption, filled by test (every process's)
        self.test_details: dict[str, Any] = {}

    # ---- losses -----------------------------------------------------------------
    def _loss(self, batch: Mapping[str, Any], smoothing: float) -> Tensor:
        """The per-token mean loss of this process's share, weighted so that DDP's mean over
        the processes is the per-token mean of the global batch (the module docstring)."""
        captions = batch["captions"]
        logits = self.model(captions, batch["inputs"], batch["masks"])
        loss = caption_cross_entropy(logits.float(), captions[:, 1:], 0, smoothing)  # Eq. 24
        return loss * (batch.get("token_share", 1.0) * self._world_size())

    def _log_loss(self, key: str, loss: Tensor, batch: Mapping[str, Any]) -> None:
        # Lightning's mean over the epoch's global batches, weighted by their sizes; its sums
        # are reduced over the processes at the epoch's end (nothing is sent per step).
        size = batch.get("global_size", len(batch["videos"]))
        self.log(key, loss, on_step=False, on_epoch=True, batch_size=size, sync_dist=True)

    def training_step(self, batch: Mapping[str, Any], batch_index: int) -> Tensor:
        loss = self._loss(batch, self.label_smoothing)
        self._log_loss("train/loss", loss, batch)
        return loss

    def validation_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        self._log_loss("val/loss", self._loss(batch, 0.0), batch)

    # ---- processes --------------------------------------------------------------------
    def _world_size(self) -> int:
        return 1 if self._trainer is None else int(self.trainer.world_size)

    def _gather(self, value: Any) -> list[Any]:
        """``value`` of every process, in process order (``[value]`` on one process)."""
        if self._world_size() == 1:
            return [value]
        gathered: list[Any] = [None] * self._world_size()
        torch.distributed.all_gather_object(gathered, value)
        return gathered

    def _from_process_zero(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on process 0 only and broadcast to the others; an exception it
        raises is raised on every process (none is left waiting)."""
        if self._world_size() == 1:
            return make()
        value: Any = None
        if self.trainer.is_global_zero:
            try:
                value = make()
            except Exception as error:  # re-raised below, on every process
                value = error
        value = self.trainer.strategy.broadcast(value, src=0)
        if isinstance(value, Exception):
            raise value
        return value

    # ---- generation ---------------------------------------------------------------
    @torch.no_grad()
    def generate(self, inputs: Sequence[Tensor], masks: Sequence[Tensor]) -> Generated:
        """Beam search (``beam_size``, ``max_length``, ``length_penalty``) for a batch of videos;
        ``<unk>`` is never generated unless ``allow_unknown``."""
        return beam_search(
            self.model.decoder, self.model.encode(inputs, masks), masks,
            begin_index=self.vocabulary.begin, end_index=self.vocabulary.end, beam_size=self.beam_size,
            max_length=self.max_length, length_penalty=self.length_penalty, banned_tokens=self.banned_tokens,
        )

    @property
    def banned_tokens(self) -> list[int]:
        """Ids never generated besides padding and begin: ``<unk>`` unless ``allow_unknown``."""
        return [] if self.allow_unknown else [self.vocabulary.index[UNKNOWN]]

    def _decode_batch(self, batch: Mapping[str, Any]) -> dict[str, str]:
        if not batch["videos"]:  # this process's share of a global batch smaller than the processes
            return {}
        generated = self.generate(batch["inputs"], batch["masks"])
        return {video: self.vocabulary.decode(row.tolist()) for video, row in zip(batch["videos"], generated.tokens, strict=True)}

    def on_test_epoch_start(self) -> None:
        self.generated = {}
        self.stage_metrics["test"].reset()
        self._test_steps: list[list[tuple[str, str]]] = []  # per step: (video, caption) of this process
        self._test_loss = [0.0, 0]  # sum of token losses, tokens

    def test_step(self, batch: Mapping[str, Any], batch_index: int) -> None:
        generated = self._decode_batch(batch)
        self._test_steps.append(list(generated.items()))
        # Teacher-forced loss over every reference caption of these videos.
        videos, rows, captions = batch["videos"], [], []
        for i, video in enumerate(videos):
            for caption in self.references.get(video, []):
                rows.append(i)
                captions.append(self.vocabulary.encode(caption, self.max_length))
        if captions:
            index = torch.tensor(rows)
            length = max(len(c) for c in captions)
            tokens = torch.tensor([c + [0] * (length - len(c)) for c in captions], device=self.device)
            inputs = [x[index] for x in batch["inputs"]]
            masks = [m[index] for m in batch["masks"]]
            logits = self.model(tokens, inputs, masks).float()
            count = int((tokens[:, 1:] != 0).sum())
            loss = caption_cross_entropy(logits, tokens[:, 1:])
            self._test_loss[0] += float(loss) * count
            self._test_loss[1] += count

    def on_test_epoch_end(self) -> None:
        if not self.references:
            raise ValueError("CaptioningTask: no reference captions were given for testing")
        processes = self._gather((self._test_steps, self._test_loss))
        # Every process ran the same global batches, its share after the previous process's:
        # step by step, in process order, the captions come in the order of one process.
        steps = zip(*(steps for steps, _ in processes), strict=True)
        self.generated = {video: caption for step in steps for share in step for video, caption in share}
        total, count = (sum(loss[i] for _, loss in processes) for i in (0, 1))
        metric = self.stage_metrics["test"]

        def score() -> dict[str, Any]:
            videos = list(self.generated)
            metric.update(videos, [self.generated[v] for v in videos], [self.references.get(v) for v in videos])
            return metric.compute()

        scores = self._from_process_zero(score)
        self.test_details = scores
        values = {f"test/{k}": float(v) for k, v in scores.items() if isinstance(v, float)}
        if count:
            values["test/loss"] = total / count
        # The same on every process: "max" over the processes keeps them bit for bit.
        self.log_dict(values, sync_dist=True, reduce_fx="max")

    def predict_step(self, batch: Mapping[str, Any], batch_index: int) -> dict[str, str]:
        return self._decode_batch(batch)

    # ---- optimiser and checkpoints ------------------------------------------------
    def configure_optimizers(self) -> Any:
        """``optim``'s optimiser and schedule (:func:`~polyfuse.tasks.optim.build_optimizer`) over
        every parameter in one group, biases included, at ``optim.weight_decay``."""
        return build_optimizer([{"params": list(self.parameters())}], self.optim_settings, lr=self.lr,
                               weight_decay=self.weight_decay)



# -- configuration: the captioning and decoder sections -----------------------------------

#: The paper's variants (Table 2) and the mean-pooled baseline: MAF orders and low rank.
VARIANTS: dict[str, tuple[str | None, bool]] = {
    "mean-pool": (None, False),
    "HOCA-U": ("U", False),
    "HOCA-B": ("B", False),
    "L-HOCA-B": ("B", True),
    "HOCA-T": ("T", False),
    "L-HOCA-T": ("T", True),
    "HOCA-UB": ("UB", False),
    "L-HOCA-UB": ("UB", True),
    "HOCA-UBT": ("UBT", False),
    "L-HOCA-UBT": ("UBT", True),
}


def variant_settings(name: str) -> tuple[str | None, bool]:
    """(MAF orders or None for no attention, low rank) of a variant name."""
    if name not in VARIANTS:
        raise ValueError(f"unknown captioning variant {name!r}; expected one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class CaptioningConfig(_Section):
    """Video captioning data, vocabulary and generation (task.type captioning)."""

    features: dict[str, str] = Field(
        description="modality name -> feature file (PATH or PATH#KEY: .npz / .h5, relative to the config file), in order"
    )
    captions: str = Field(description="captions: JSON {video_id: [captions]} (or the formats of docs/CAPTIONING.md) or CSV")
    splits: str = Field(description="JSON {train: [ids], val: [ids], test: [ids]}")
    frame_stride: Annotated[int, Field(ge=1)] = Field(1, description="keep every k-th feature step of every modality")
    standardize: bool = Field(True, description="standardise each feature with the training videos' mean and std")
    missing_features: Literal["error", "skip"] = Field(
        "error", description="a split video without features in some modality: error, or skip it (counted)"
    )
    min_count: Annotated[int, Field(ge=1)] = Field(
        1, description="vocabulary: training-caption words seen at least this often (1: every one, as the paper)"
    )
    max_words: SizeInt = Field(20, description="training captions are cut to this many words")
    beam_size: SizeInt = Field(5, description="beam width at test and predict time (1: greedy)")
    max_length: SizeInt = Field(20, description="most generated tokens, end token included")
    length_penalty: Annotated[float, Field(ge=0.0)] = Field(
        1.0, description="length normalisation: score / length ** length_penalty (0: none)"
    )
    allow_unknown: bool = Field(
        False, description="let beam search generate <unk> (default: never; the softmax is over the other words)"
    )
    meteor: bool = Field(True, description="score METEOR at test time (needs Java)")

    @field_validator("features")
    @classmethod
    def _some_features(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("captioning.features names no modality")
        return value


class DecoderConfig(_Section):
    """The caption encoder-decoder (HOCA Fig. 3) and its attention variant."""

    variant: Literal[tuple(VARIANTS)] = Field(  # type: ignore[valid-type]
        "HOCA-UBT", description="mean-pool | HOCA-U | HOCA-B | L-HOCA-B | HOCA-T | L-HOCA-T | HOCA-UB | L-HOCA-UB | HOCA-UBT | L-HOCA-UBT"
    )
    encoder: Literal["bilstm", "linear"] = Field(
        "bilstm", description="per-modality encoder: bilstm (the paper's Bi-LSTM, both directions concatenated) | linear (tanh(linear))"
    )
    feature_dim: SizeInt | None = Field(
        128, description="encoder size: bilstm hidden size per direction (output 2x), linear output size (null: raw features; paper: 512)"
    )
    embed_dim: SizeInt = Field(128, description="word embedding size (paper: 300; 384 with word_vectors: minilm)")
    word_vectors: Literal["minilm", "glove"] | None = Field(
        None, description="initialise the word embeddings: minilm (MiniLM word pieces, 384-d) | glove (word_vectors_file) | null (random)"
    )
    word_vectors_file: str | None = Field(
        None, description="word_vectors: glove: a GloVe-format text file of embed_dim-d vectors (relative to the config file)"
    )
    hidden_dim: SizeInt = Field(256, description="LSTM hidden size (paper: 512)")
    attention_dim: SizeInt = Field(64, description="attention layer size (paper: 512)")
    rank: SizeInt = Field(1, description="rank of Low-Rank HOCA (paper: 1)")
    combination: Literal["log", "literal"] = Field("log", description="form of Eq. 19 (see polyfuse.nn.maf)")
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.5, description="dropout rate, where dropout_at says (paper: 0.5)")
    dropout_at: Literal["encoder+decoder", "decoder"] = Field(
        "encoder+decoder", description="encoder+decoder: on each encoder's output and on the decoder LSTM's input "
        "and output | decoder: on the decoder LSTM's input and output only (HOCA section 5.2)"
    )

    @model_validator(mode="after")
    def _word_vectors(self) -> DecoderConfig:
        if self.word_vectors == "minilm" and self.embed_dim != MINILM_DIM:
            raise ValueError(
                f"decoder.word_vectors: minilm gives {MINILM_DIM}-d word vectors: set decoder.embed_dim: {MINILM_DIM} "
                f"(got {self.embed_dim})"
            )
        if self.word_vectors == "glove" and not self.word_vectors_file:
            raise ValueError("decoder.word_vectors: glove needs decoder.word_vectors_file (a GloVe-format text file)")
        if self.word_vectors_file and self.word_vectors != "glove":
            raise ValueError("decoder.word_vectors_file is read only with decoder.word_vectors: glove")
        return self


# -- the task type -----------------------------------------------------------------------


def build_captioning_data(config: Mapping[str, Any], vocabulary: Sequence[str] | None = None) -> CaptioningData:
    """The videos, features and captions of a resolved captioning configuration
    (``vocabulary``: a checkpoint's; None builds it from the training captions)."""
    section = config["captioning"]
    return prepare_captioning(
        section["features"], section["captions"], section["splits"], frame_stride=section["frame_stride"],
        missing_features=section["missing_features"], min_count=section["min_count"],
        max_words=section["max_words"], vocabulary=vocabulary, standardize=section["standardize"],
    )


def build_captioning_task(
    config: Mapping[str, Any], input_dims: Sequence[int], max_lengths: Sequence[int], vocabulary: Any
) -> CaptioningTask:
    """The task of a resolved captioning configuration around a new :class:`VideoCaptioner`."""
    decoder, section = config["decoder"], config["captioning"]
    orders, low_rank = variant_settings(decoder["variant"])
    model = VideoCaptioner(
        input_dims, len(vocabulary), orders=orders, low_rank=low_rank, max_lengths=max_lengths,
        feature_dim=decoder["feature_dim"], embed_dim=decoder["embed_dim"], hidden_dim=decoder["hidden_dim"],
        attention_dim=decoder["attention_dim"], rank=decoder["rank"], combination=decoder["combination"],
        dropout=decoder["dropout"], encoder=decoder["encoder"], dropout_at=decoder.get("dropout_at", "encoder+decoder"),
    )
    return CaptioningTask(
        model, vocabulary, lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
        label_smoothing=config["task"]["label_smoothing"], beam_size=section["beam_size"],
        max_length=section["max_length"], length_penalty=section["length_penalty"], meteor=section["meteor"],
        allow_unknown=section["allow_unknown"], optim=OptimSettings.from_config(config),
    )


def initialise_word_embeddings(task: CaptioningTask, decoder: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Set the decoder's word embeddings to pre-trained vectors (HOCA section 5.2: words
    without one are drawn at random; :mod:`polyfuse.data.formats.word_vectors`)."""
    words = task.vocabulary.words
    vectors, found = caption_word_vectors(
        words, decoder["word_vectors"], file=decoder["word_vectors_file"], dim=decoder["embed_dim"]
    )
    table, count = initial_word_embedding(vectors, found, generator=torch.Generator().manual_seed(seed))
    embedding = task.model.decoder.embedding.weight
    with torch.no_grad():
        embedding.copy_(table.to(embedding.dtype))
    return {"source": decoder["word_vectors"], "found": count, "words": len(words) - 4}


def reference_oov(data: CaptioningData, split: str) -> dict[str, Any]:
    """Word tokens of ``split``'s reference captions outside the vocabulary (PTB tokens)."""
    tokens = [w for v in data.splits.get(split, []) for c in data.captions[v] for w in ptb_tokenize(c)]
    unknown = sum(w not in data.vocabulary.index for w in tokens)
    return {"tokens": len(tokens), "unknown": unknown, "rate": round(unknown / len(tokens), 4) if tokens else None}


def checkpoint_captioning_data(extras: Mapping[str, Any]) -> CaptioningData:
    """The videos of a checkpoint's configuration, encoded with its vocabulary; features
    of other sizes or longer than in training are refused."""
    data = build_captioning_data(extras["config"], vocabulary=extras["label_info"]["vocabulary"])
    if data.input_dims != list(extras["input_dims"]):
        raise ValueError(
            f"the feature files give sizes {data.input_dims}; the checkpoint was trained on {list(extras['input_dims'])}"
        )
    if any(n > m for n, m in zip(data.max_lengths, extras["label_info"]["max_lengths"], strict=True)):
        raise ValueError(f"the features are longer ({data.max_lengths}) than in training ({extras['label_info']['max_lengths']})")
    return data




@register_task
class CaptioningSpec(TaskSpec):
    """``task.type: captioning`` (HOCA section 4.4, docs/CAPTIONING.md): feature files per
    stream, captions and splits of the ``captioning`` section; the decoder of ``decoder``.
    A training run also writes ``test_captions.json``: the caption generated for every
    test video by the best checkpoint, beside its references."""

    name = "captioning"
    config_sections: ClassVar[dict[str, type]] = {"captioning": CaptioningConfig, "decoder": DecoderConfig}
    sections = ("captioning", "decoder")
    required_sections = ("captioning",)
    model_sections = ("decoder",)
    default_monitor = CaptioningTask.default_monitor
    prediction_suffix = ".json"
    reads_own_files = True
    path_keys = ("captioning.captions", "captioning.splits", "decoder.word_vectors_file")
    path_mappings = ("captioning.features",)
    figure_options = ("video", "clips")

    def check_config(self, config: Any) -> None:
        if config.decoder is None:
            config.decoder = DecoderConfig()

    def build_data(self, config: Mapping[str, Any]) -> TaskData[CaptioningData]:
        data = build_captioning_data(config)
        batch_size = config["data"]["batch_size"]
        datamodule = CaptioningDataModule(
            data, batch_size=batch_size, eval_batch_size=config["data"]["eval_batch_size"], seed=int(config["seed"]),
            loader=loader_options(config),
        )
        samples = {split: len(videos) for split, videos in data.splits.items()}
        return TaskData(datamodule, data, samples, -(-len(data.pairs("train")) // batch_size))

    def build_module(self, config: Mapping[str, Any], data: TaskData[CaptioningData]) -> CaptioningTask:
        prepared = data.prepared
        task = build_captioning_task(config, prepared.input_dims, prepared.max_lengths, prepared.vocabulary)
        task.references = prepared.captions
        return task

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[CaptioningData]) -> dict[str, Any]:
        prepared = data.prepared
        return {
            "config": dict(config), "modalities": prepared.modalities, "input_dims": prepared.input_dims,
            "label_info": {"vocabulary": prepared.vocabulary.words, "max_lengths": prepared.max_lengths}, "stats": {},
        }

    def prepare_module(self, module: Any, config: Mapping[str, Any], data: TaskData[CaptioningData], resuming: bool) -> dict[str, Any]:
        word_vectors = None
        if not resuming and config["decoder"]["word_vectors"]:
            word_vectors = initialise_word_embeddings(module, config["decoder"], int(config["seed"]))
        return {"word_vectors": word_vectors}

    def after_test(self, module: Any, data: TaskData[CaptioningData], run_dir: Path) -> dict[str, Any]:
        prepared = data.prepared
        atomic_write_text(run_dir / "test_captions.json", json.dumps(
            {v: {"generated": module.generated[v], "references": prepared.captions[v]} for v in prepared.splits["test"]},
            indent=2) + "\n")
        return {
            "skipped_videos": prepared.skipped, "vocabulary": len(prepared.vocabulary),
            "test_reference_oov": reference_oov(prepared, "test"),
            "metric_details": {k: v for k, v in module.test_details.items() if not isinstance(v, float)},
        }

    def module_from_extras(self, extras: Mapping[str, Any]) -> CaptioningTask:
        info = extras["label_info"]
        return build_captioning_task(extras["config"], extras["input_dims"], info["max_lengths"], Vocabulary(info["vocabulary"]))

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        **options: Any) -> TaskData[CaptioningData]:
        data = checkpoint_captioning_data(extras)
        module = CaptioningDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"],
                                      loader=loader_options(extras["config"]))
        module.loader(split)  # an unknown split is refused before anything runs
        return TaskData(module, data, {split: len(videos) for split, videos in data.splits.items()})

    def loaders(self, data: TaskData[CaptioningData], split: str) -> dict[str, Any]:
        return {split: data.datamodule.loader(split)}

    def bind(self, module: Any, data: TaskData[CaptioningData], **options: Any) -> None:
        module.references = data.prepared.captions

    def records(self, module: Any, outputs: Mapping[str, Sequence[Any]], data: TaskData[CaptioningData],
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``id`` and ``caption`` of every video."""
        return [{"id": video, "caption": caption}
                for batches in outputs.values() for batch in batches for video, caption in batch.items()]

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        """JSON ``{video id: caption}``."""
        atomic_write_text(Path(path), json.dumps({r["id"]: r["caption"] for r in records}, indent=2) + "\n")

    def attention_figures(self, module: Any, extras: Mapping[str, Any], out: Path, *, split: str, sample: int,
                          source: str | None, modalities: Sequence[str] | None, video: str | None = None,
                          clips: str | None = None) -> list[Path]:
        """The caption of one video (``video``, or the ``sample``-th of ``split``) with its
        frames and MAF's attention per generated word (:mod:`polyfuse.tasks.captioning.figure`)."""
        from polyfuse.tasks.captioning.figure import plot_caption_attention, video_of

        data = checkpoint_captioning_data(extras)
        video = video or video_of(data, split, sample)
        return [plot_caption_attention(module, dict(extras), video, out, clips=clips, data=data)]
