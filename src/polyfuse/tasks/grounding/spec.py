"""Phrase grounding as an engine task (``task.type: grounding``; BAN section 5.1-5.3,
Table 4, Flickr30k Entities): :class:`~polyfuse.nn.models.grounding.BanGrounding` scores
every candidate box for every phrase of a caption with BAN's attention logits, trained
with binary cross-entropy against the boxes at IoU >= 0.5 (:func:`grounding_loss`).

Logged: ``train/loss``; ``val/`` and ``test/`` ``loss``, ``R@1``, ``R@5``, ``R@10``
(phrases whose K best boxes hold one at IoU >= 0.5 with the ground truth) and
``upper_bound`` (phrases with any such candidate box), fractions in [0, 1]
(:class:`~polyfuse.metrics.grounding.GroundingRecall`). The best checkpoint has the
highest ``val/R@1``.

Legend for shapes: ``B`` captions, ``P`` phrases, ``O`` boxes, ``k`` boxes kept per phrase.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from polyfuse.atomic import atomic_write_text
from polyfuse.data.loading import loader_options
from polyfuse.metrics.grounding import GroundingRecall
from polyfuse.nn.models.grounding import BanGrounding
from polyfuse.sizes import SizeInt
from polyfuse.tasks.base import StagedEvaluation
from polyfuse.tasks.grounding.data import GroundingData, GroundingDataModule, build_grounding_data
from polyfuse.tasks.optim import OptimSettings, build_optimizer
from polyfuse.tasks.registry import TaskData, TaskSpec, register_task

__all__ = ["GroundingDataConfig", "GroundingModelConfig", "GroundingSpec", "GroundingTask", "grounding_loss"]


def grounding_loss(scores: Tensor, targets: Tensor, phrase_mask: Tensor, boxes_mask: Tensor) -> Tensor:
    """Binary cross-entropy of every (phrase, box) score against its 0/1 target, summed
    over the real phrases and boxes and divided by the captions B (ban-vqa's
    ``train_flickr.train``: ``instance_bce_with_logits(..., 'sum') / v.size(0)``; BAN
    section 5.3: "binary cross entropy is used for this output").

    scores, targets (B, P, O); phrase_mask (B, P), boxes_mask (B, O) bool."""
    real = phrase_mask.unsqueeze(-1) & boxes_mask.unsqueeze(1)  # (B, P, O)
    return F.binary_cross_entropy_with_logits(scores[real], targets[real], reduction="sum") / scores.shape[0]


def _boxes_mask(batch: Mapping[str, Tensor]) -> Tensor:
    return batch["image"].abs().sum(dim=-1) != 0  # (B, O): all-zero rows are padding


class GroundingTask(StagedEvaluation):
    """A :class:`BanGrounding` trained with :func:`grounding_loss`; ``forward(batch)``
    returns the scores (B, P, O). Optimiser and schedule as every task."""

    task_type = "grounding"
    default_monitor = ("val/R@1", "max")
    #: boxes per phrase that :meth:`predict_step` returns (``polyfuse predict --top-k``)
    predict_top_k = 5

    def __init__(self, model: nn.Module, *, lr: float = 1e-3, weight_decay: float = 0.0,
                 optim: OptimSettings | None = None) -> None:
        super().__init__()
        self.optim_settings = optim or OptimSettings()
        self.model = model
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.stage_metrics = nn.ModuleDict({"val": GroundingRecall(), "test": GroundingRecall()})

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        return self.model(batch["tokens"], batch["image"], batch["positions"], batch["phrase_mask"]).float()

    def training_step(self, batch: Mapping[str, Tensor], batch_index: int) -> Tensor:
        loss = grounding_loss(self(batch), batch["targets"], batch["phrase_mask"], _boxes_mask(batch))
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        return loss

    def _evaluation_step(self, stage: str, batch: Mapping[str, Tensor]) -> None:
        scores = self(batch)
        loss = grounding_loss(scores, batch["targets"], batch["phrase_mask"], _boxes_mask(batch))
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        self.stage_metrics[stage].update(scores, batch["targets"] > 0, batch["phrase_mask"])

    def predict_step(self, batch: Mapping[str, Tensor], batch_index: int) -> dict[str, Tensor]:
        """Per phrase the :attr:`predict_top_k` best boxes (B, P, k, 4) in pixels, their
        ``scores`` (B, P, k), the sigmoid of the logit (the probability the box is at
        IoU >= 0.5, as trained), and ``hits`` (B, P, k), whether each is."""
        scores = self(batch)
        k = min(self.predict_top_k, scores.shape[-1])
        ranked, order = torch.sort(scores, dim=-1, descending=True, stable=True)
        order = order[..., :k]
        boxes = batch["boxes"].unsqueeze(1).expand(-1, scores.shape[1], -1, -1)  # (B, P, O, 4)
        return {"row": batch["row"], "phrase_mask": batch["phrase_mask"], "scores": torch.sigmoid(ranked[..., :k]),
                "boxes": boxes.gather(2, order.unsqueeze(-1).expand(-1, -1, -1, 4)),
                "hits": batch["targets"].gather(2, order) > 0, "box_index": order}

    def configure_optimizers(self) -> Any:
        """The optimiser and schedule of ``optim`` (:func:`~polyfuse.tasks.optim.build_optimizer`;
        ban-vqa's Adamax and warm-up with ``adamax`` and ``ban_warmup``)."""
        return build_optimizer(self, self.optim_settings, lr=self.lr, weight_decay=self.weight_decay)


# -- configuration: data.grounding and model.grounding -----------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class GroundingDataConfig(_Section):
    # One line each: docs/CONFIGURATION.md shows the docstring as it is.
    """Phrase grounding data (task.type grounding): the Flickr30k Entities release and region features."""

    entities: str = Field(description="folder of the Flickr30k Entities release: Sentences/, Annotations/ and the split files (relative to the config file)")
    features: str = Field(description="HDF5 region features of the images, keyed by image id (polyfuse extract images, or ban-vqa's fixed or adaptive bottom-up layout with features_index)")
    features_index: str | None = Field(None, description="image id -> row of a bottom-up features file (JSON object or CSV image_id,row)")
    val_features: str | None = Field(None, description="features of the val images when not in features (ban-vqa ships one file per split)")
    val_features_index: str | None = Field(None, description="image-id index of a bottom-up val_features")
    test_features: str | None = Field(None, description="features of the test images when not in features")
    test_features_index: str | None = Field(None, description="image-id index of a bottom-up test_features")
    train_split: str = Field("train.txt", description="file of the training image ids, one per line, inside entities")
    val_split: str = Field("val.txt", description="file of the validation image ids inside entities")
    test_split: str = Field("test.txt", description="file of the test image ids inside entities")
    max_length: SizeInt = Field(82, description="words kept per caption; phrases ending beyond are skipped (BAN section 5.2 and ban-vqa: 82, the longest caption)")
    min_word_count: Annotated[int, Field(ge=1)] = Field(1, description="caption words seen this many times in training form the vocabulary; the others share one unknown-word row")
    match: Literal["any", "union"] = Field("any", description="a box grounds a phrase at IoU >= 0.5 with any of its ground-truth boxes (BAN section 5.1, ban-vqa) or with their union box")


class GroundingModelConfig(_Section):
    """Phrase grounding model (task.type grounding): BAN's caption encoder; glimpses, attention rank and dropouts are model.options.ban."""

    hidden_dim: SizeInt = Field(1280, description="H: caption GRU size; the attention rank is k H (ban-vqa's --num_hid default 1280)")
    embedding_dim: SizeInt = Field(300, description="word embedding size (300, GloVe's)")
    glove: str | None = Field(None, description="GloVe-format text file initialising the word embedding (relative to the config file)")


_BAN_OPTIONS = ("glimpses", "k", "attention_rank", "dropout", "attention_dropout")


def build_grounding_model(config: Mapping[str, Any], num_words: int, image_dim: int, *,
                          word_vectors: Tensor | None = None) -> BanGrounding:
    """The model of a resolved configuration: ``model.grounding`` and the attention options of
    ``model.options.ban`` (glimpses, k, attention_rank, dropout, attention_dropout)."""
    settings = config["model"]["grounding"]
    options = dict(config["model"]["options"].get("ban") or {})
    unused = sorted(set(options) - set(_BAN_OPTIONS))
    if unused:
        raise ValueError(f"model.options.ban.{unused[0]}: grounding uses BAN's attention map only; it takes "
                         f"{', '.join(_BAN_OPTIONS)} (its size is model.grounding.hidden_dim)")
    return BanGrounding(num_words, image_dim, hidden_dim=settings["hidden_dim"], embedding_dim=settings["embedding_dim"],
                        word_vectors=word_vectors, **options)


def build_grounding_task(config: Mapping[str, Any], words: Sequence[str], image_dim: int,
                         word_vectors: Tensor | None = None) -> GroundingTask:
    model = build_grounding_model(config, len(words), image_dim, word_vectors=word_vectors)
    return GroundingTask(model, lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
                         optim=OptimSettings.from_config(config))


def _datamodule(data: GroundingData, config: Mapping[str, Any], *, batch_size: int, seed: int = 0) -> GroundingDataModule:
    return GroundingDataModule(data, batch_size=batch_size, eval_batch_size=config["data"]["eval_batch_size"], seed=seed,
                               loader=loader_options(config))


@register_task
class GroundingSpec(TaskSpec):
    """``task.type: grounding`` (docs/GROUNDING.md): Flickr30k Entities phrases and region
    features of ``data.grounding``; BAN's attention logits with ``model.grounding`` and
    ``model.options.ban``. A checkpoint stores the word vocabulary beside the weights."""

    name = "grounding"
    config_sections: ClassVar[dict[str, type]] = {"data.grounding": GroundingDataConfig,
                                                  "model.grounding": GroundingModelConfig}
    sections = ("data.grounding", "model.grounding")
    required_sections = ("data.grounding",)
    default_monitor = GroundingTask.default_monitor
    prediction_suffix = ".json"
    predict_options: ClassVar[dict[str, Any]] = {"top_k": 5}
    fusions = ("ban",)
    reads_own_files = True
    path_keys = (
        *(f"data.grounding.{key}" for key in ("entities", "features", "features_index", "val_features",
                                              "val_features_index", "test_features", "test_features_index")),
        "model.grounding.glove",
    )  # fmt: skip

    def check_config(self, config: Any) -> None:
        if config.data.source is not None:
            raise ValueError("task.type grounding reads data.grounding; remove data.source")
        if config.model.grounding is None:
            config.model.grounding = GroundingModelConfig()

    def build_data(self, config: Mapping[str, Any]) -> TaskData[GroundingData]:
        data = build_grounding_data(config)
        for note in data.notes:
            print(note)
        datamodule = _datamodule(data, config, batch_size=config["data"]["batch_size"], seed=int(config["seed"]))
        samples = {key: len(split) for key, split in data.splits.items()}
        return TaskData(datamodule, data, samples, -(-samples["train"] // config["data"]["batch_size"]))

    def build_module(self, config: Mapping[str, Any], data: TaskData[GroundingData]) -> GroundingTask:
        return build_grounding_task(config, data.prepared.words, data.prepared.image_dim, data.prepared.word_vectors)

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[GroundingData]) -> dict[str, Any]:
        return {"config": dict(config), "modalities": ["image", "caption"],
                "input_dims": [data.prepared.image_dim, len(data.prepared.words)],
                "label_info": {"words": data.prepared.words}, "stats": {}}

    def module_from_extras(self, extras: Mapping[str, Any]) -> GroundingTask:
        return build_grounding_task(extras["config"], extras["label_info"]["words"], int(extras["input_dims"][0]))

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        top_k: int = 5) -> TaskData[GroundingData]:
        """A split of the checkpoint's data (``all``: train, val and test when predicting),
        encoded with its vocabulary."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"--top-k must be a positive integer, got {top_k!r}")
        if split == "all" and require_labels:
            raise ValueError("evaluate a grounding checkpoint on one split: train, val or test")
        if split not in ("all", "train", "val", "test"):
            raise ValueError(f"a grounding checkpoint is applied to the split train, val, test or all, not {split!r}")
        keys = ["train", "val", "test"] if split == "all" else [split]
        data = build_grounding_data(extras["config"], vocabulary=extras["label_info"], splits=keys)
        datamodule = _datamodule(data, extras["config"], batch_size=1)
        return TaskData(datamodule, data, {key: len(part) for key, part in data.splits.items()})

    def loaders(self, data: TaskData[GroundingData], split: str) -> dict[str, Any]:
        return {key: data.datamodule.loader(key) for key in data.prepared.splits}

    def bind(self, module: Any, data: TaskData[GroundingData], *, top_k: int = 5) -> None:
        module.stage_metrics["test"].reset()
        module.predict_top_k = top_k

    def records(self, module: Any, outputs: Mapping[str, Sequence[Any]], data: TaskData[GroundingData],
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One record per phrase: ``split``, ``image_id``, ``caption`` (its line in
        Sentences/<image id>.txt, from 0), ``phrase``, ``entity_id``, ``types``, ``boxes``
        (the k best, [x1, y1, x2, y2] in pixels), ``scores`` (their sigmoids), ``hits``
        (each at IoU >= 0.5 with the ground truth) and ``truth`` (the ground-truth boxes)."""
        records = []
        for key, batches in outputs.items():
            items = data.prepared.splits[key].items
            for output in batches or []:
                for b, row in enumerate(output["row"].tolist()):
                    item = items[row]
                    for p, phrase in enumerate(item.phrases):
                        records.append({
                            "split": key, "image_id": item.image_id, "caption": item.caption, "phrase": phrase.text,
                            "entity_id": phrase.entity_id, "types": list(phrase.types),
                            "boxes": [[round(float(v), 2) for v in box] for box in output["boxes"][b, p].tolist()],
                            "scores": [round(float(s), 6) for s in output["scores"][b, p].tolist()],
                            "hits": [bool(h) for h in output["hits"][b, p].tolist()],
                            "truth": [list(box) for box in phrase.truth],
                        })  # fmt: skip
        return records

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        """A JSON list of the records, one a line."""
        atomic_write_text(Path(path), "[\n" + ",\n".join(json.dumps(dict(r)) for r in records) + "\n]\n")

    def attention_figures(self, module: Any, extras: Mapping[str, Any], out: Path, *, split: str, sample: int,
                          source: str | None, modalities: Sequence[str] | None) -> list[Path]:
        """BAN's attention maps (boxes x caption words) of the ``sample``-th caption of ``split``."""
        from polyfuse.tasks.attention_figure import draw_fusion_attention

        if source or modalities:
            raise ValueError("--data and --modalities do not apply to a grounding checkpoint: it reads data.grounding")
        data = self.checkpoint_data(extras, split=split, require_labels=False)
        part = data.prepared.splits[split if split != "all" else "test"]
        if not 0 <= sample < len(part):
            raise ValueError(f"--sample {sample} lies outside the {len(part)} captions of the {split} split")
        batch = part.batch(torch.tensor([sample]))
        item = part.items[sample]
        module.eval()
        with torch.no_grad():
            maps = module.model.attention(batch["tokens"], batch["image"])[0]  # (G, O, L)
        boxes, words = int(_boxes_mask(batch)[0].sum()), min(len(item.words), maps.shape[-1])
        attention = {"kind": "ban", "maps": maps[:, :boxes, :words].float().numpy(), "names": ["box", "word"],
                     "lengths": [boxes, words], "labels": [[str(o) for o in range(boxes)], list(item.words[:words])]}
        title = f"{split} caption {sample} (image {item.image_id}, line {item.caption}): {' '.join(item.words)}"
        return [draw_fusion_attention(attention, out, title=title)]
