"""Visual question answering as an engine task (``task.type: vqa``): a model of
:mod:`polyfuse.nn.models.vqa`, binary cross-entropy on soft scores (BAN section 5,
following Teney et al.) and the official VQA accuracy, overall and per type.

Legend for shapes: ``B`` questions of a batch, ``A`` answers, ``K`` candidate answers of
a question (see :mod:`polyfuse.tasks.vqa.data`), ``T`` types of the breakdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from polyfuse.atomic import write_csv
from polyfuse.data.loading import loader_options
from polyfuse.extract.images import feature_settings
from polyfuse.metrics.vqa import VQAScore
from polyfuse.nn.models.vqa import BanVQA, FusionVQA
from polyfuse.sizes import SizeInt
from polyfuse.tasks.base import StagedEvaluation, log_attention_modes
from polyfuse.tasks.building import fusion_options
from polyfuse.tasks.optim import OptimSettings, build_optimizer
from polyfuse.tasks.registry import TaskData, TaskSpec, register_task
from polyfuse.tasks.vqa.data import VQAData, VQADataModule, build_vqa_data
from polyfuse.tasks.vqa.new_questions import NEW_SPLIT, new_questions_data

__all__ = [
    "PREDICTION_FIELDS", "VQADataConfig", "VQAModelConfig", "VQASpec", "VQATask", "build_vqa_task",
    "prediction_fields", "vqa_loss",
]


def vqa_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Binary cross-entropy of every answer against its soft score, summed over answers
    and averaged over questions (ban-vqa's ``instance_bce_with_logits``)."""
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="mean") * targets.shape[1]




class VQATask(StagedEvaluation):
    """A VQA model (:func:`polyfuse.nn.models.vqa.build_vqa_model`) trained with :func:`vqa_loss`; logs
    ``<stage>/loss``, ``<stage>/acc`` (official VQA accuracy) and ``<stage>/acc/<type>``.

    ``forward(batch)`` returns (logits (B, A), attention (B, G, O, L) or None).
    Optimiser (:meth:`configure_optimizers`) and checkpoint extras as :class:`~polyfuse.tasks.base.FusionTask`.
    """

    task_type = "vqa"
    default_monitor = ("val/acc", "max")
    #: answers per question that :meth:`predict_step` returns (``polyfuse predict --top-k``)
    predict_top_k = 1

    def __init__(
        self,
        model: nn.Module,
        *,
        type_names: Sequence[str],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        scheduler: str = "none",
        max_epochs: int | None = None,
        optimizer: str = "adamw",
        decay_rate: float | None = None,
        decay_every: int | None = None,
    ) -> None:
        super().__init__()
        self.optim_settings = OptimSettings(optimizer, scheduler, max_epochs, decay_rate, decay_every)
        self.model = model
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.stage_metrics = nn.ModuleDict({"val": VQAScore(type_names), "test": VQAScore(type_names)})

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        logits, attention = self.model(batch["tokens"], batch["image"], batch["boxes"])
        return logits.float(), attention

    def training_step(self, batch: Mapping[str, Tensor], batch_index: int) -> Tensor:
        loss = vqa_loss(self(batch)[0], batch["target"])
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, "train", len(batch["row"]))
        return loss

    def _evaluation_step(self, stage: str, batch: Mapping[str, Tensor]) -> None:
        logits = self(batch)[0]
        loss = vqa_loss(logits, batch["target"])
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["row"]), sync_dist=True)
        log_attention_modes(self, stage, len(batch["row"]))
        self.stage_metrics[stage].update(logits.argmax(dim=1), batch["answer_ids"], batch["answer_scores"], batch["answer_type"])

    def predict_step(self, batch: Mapping[str, Tensor], batch_index: int) -> dict[str, Tensor]:
        """The :attr:`predict_top_k` answers of each question, best first: ``answers``
        (B, k) and their ``scores`` (B, k), each the sigmoid of its logit, the probability
        the model was trained to give that answer's soft score (:func:`vqa_loss`; the
        answers are scored independently, so the scores need not sum to 1); ``answer``
        and ``score`` (B,), the first of them."""
        logits = self(batch)[0]
        # ranked by logit (the sigmoid is monotone but saturates to 1.0 in float32); a
        # stable sort keeps the lower index first on ties, as the argmax of evaluation does
        ranked, answers = torch.sort(logits, dim=1, descending=True, stable=True)
        answers, scores = answers[:, : self.predict_top_k], torch.sigmoid(ranked[:, : self.predict_top_k])
        return {"row": batch["row"], "answer": answers[:, 0], "score": scores[:, 0], "answers": answers, "scores": scores}

    def configure_optimizers(self) -> Any:
        """The optimiser and schedule of ``optim`` (:func:`~polyfuse.tasks.optim.build_optimizer`;
        AdamW by default, ban-vqa's Adamax and warm-up with ``adamax`` and ``ban_warmup``), no
        weight decay on biases, as the tabular tasks."""
        return build_optimizer(self, self.optim_settings, lr=self.lr, weight_decay=self.weight_decay)


# -- configuration: data.vqa and model.vqa -----------------------------------------------

_SPLIT_FILES = ("train_questions", "train_annotations", "test_questions", "test_annotations")


class _VQASection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class VQADataConfig(_VQASection):
    # One line each: docs/CONFIGURATION.md shows the docstring as it is.
    """VQA data (task.type vqa): VQA 2.0 JSON or easy-VQA, image features; validation: data.validation_fraction of the training images."""

    easy_vqa: bool = Field(False, description="questions of the installed easy-vqa package (instead of the four JSON files)")
    train_questions: str | None = Field(None, description="VQA 2.0 questions JSON of the training split (relative to the config file)")
    train_annotations: str | None = Field(None, description="VQA 2.0 annotations JSON of the training split")
    test_questions: str | None = Field(None, description="questions JSON of the test split")
    test_annotations: str | None = Field(None, description="annotations JSON of the test split")
    train_features: str = Field(description="HDF5 features of the training images (polyfuse extract images; with train_features_index, ban-vqa's bottom-up layout)")
    test_features: str = Field(description="HDF5 features of the test images (as train_features)")
    train_features_index: str | None = Field(
        None, description="image id -> row of train_features (a JSON object or CSV columns image_id,row): train_features is then a bottom-up file of ban-vqa, fixed or adaptive layout (told by its pos_boxes)"
    )
    test_features_index: str | None = Field(None, description="image id -> row of a bottom-up test_features (as train_features_index)")
    min_answer_count: Annotated[int, Field(ge=1)] = Field(9, description="answers counted at least this many times (answer_count) form the answer vocabulary (the paper, ban-vqa: 9)")
    answer_count: Literal["multiple_choice", "all_answers"] = Field(
        "multiple_choice", description="multiple_choice: count the questions whose multiple-choice answer it is (the paper, ban-vqa); all_answers: count every human answer"
    )
    answers_from: Literal["train", "train+val"] = Field(
        "train", description="whose answers are counted: train (the training split) | train+val (ban-vqa's train2014 + val2014: train_annotations and test_annotations, every split; the test split's answers then shape the vocabulary)"
    )
    soft_score: Literal["ban_vqa", "min_third"] = Field(
        "ban_vqa", description="training target of an answer n humans gave: ban_vqa 0.3/0.6/0.9/1 for n = 1/2/3/4+ (ban-vqa's; the paper gives none); min_third min(n/3, 1)"
    )
    min_word_count: Annotated[int, Field(ge=1)] = Field(2, description="question words seen at least this many times form the word vocabulary; rarer and unseen words share one trained unknown-word row")
    max_length: SizeInt = Field(14, description="words kept per question (ban-vqa: 14)")
    feature_dim: SizeInt | None = Field(None, description="reduce image features to this many principal components of the training images (null: keep all)")
    breakdown: Literal["answer_type", "question_type"] = Field(
        "answer_type", description="per-type accuracies by answer_type (VQA 2.0: yes/no, number, other) or question_type"
    )

    @model_validator(mode="after")
    def _one_source(self) -> VQADataConfig:
        given = [name for name in _SPLIT_FILES if getattr(self, name) is not None]
        if self.easy_vqa and given:
            raise ValueError(f"data.vqa: easy_vqa: true reads the installed package; remove {', '.join(given)}")
        if not self.easy_vqa and len(given) != len(_SPLIT_FILES):
            missing = [name for name in _SPLIT_FILES if name not in given]
            raise ValueError(f"data.vqa: set easy_vqa: true or all four JSON files (missing {', '.join(missing)})")
        return self


class VQAModelConfig(_VQASection):
    """VQA model (task.type vqa): the question encoder, the counter and the classifier around
    ``model.fusion``, whose options are ``model.options.<fusion>`` (BAN's glimpses and
    dropouts: ``model.options.ban``)."""

    hidden_dim: SizeInt = Field(1024, description="H: question GRU and joint representation size (the paper: 1024)")
    embedding_dim: SizeInt = Field(300, description="word embedding size (300, GloVe's)")
    glove: str | None = Field(None, description="GloVe-format text file initialising the word embedding (relative to the config file)")
    second_embedding_dim: SizeInt | None = Field(
        None, description="size of a second trained word embedding concatenated to the first before the GRU (ban-vqa's --op c, its default and the released BAN-Glove-Counter: 300); null: one embedding"
    )
    counter_objects: SizeInt | None = Field(10, description="BAN: objects kept by the counting module (ban-vqa: 10); null: no counter")
    classifier_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.5, description="dropout of the two-layer classifier (ban-vqa: 0.5)")


# -- the task type -----------------------------------------------------------------------

#: The CSV columns of a VQA prediction (then ``answer_<r>, score_<r>`` for ranks 2 .. top_k).
PREDICTION_FIELDS = ("split", "question_id", "image_id", "question", "answer", "score", "accuracy", "type")


def prediction_fields(top_k: int = 1) -> list[str]:
    """The CSV columns of a VQA prediction: the :data:`PREDICTION_FIELDS`, then
    ``answer_<r>, score_<r>`` for the ranks r = 2 .. ``top_k``."""
    return [*PREDICTION_FIELDS, *(f"{name}_{rank}" for rank in range(2, top_k + 1) for name in ("answer", "score"))]


def _vocabulary(data: VQAData) -> dict[str, Any]:
    stored: dict[str, Any] = {"words": data.words, "answers": data.answers, "type_names": data.type_names}
    if data.pca is not None:
        stored["pca_mean"], stored["pca_directions"] = data.pca
    return stored


def build_vqa_model(config: Mapping[str, Any], num_words: int, num_answers: int, image_dim: int, *,
                    word_vectors: Tensor | None = None) -> BanVQA | FusionVQA:
    """The model of a resolved VQA configuration: ``model.fusion: ban`` is
    :class:`~polyfuse.nn.models.vqa.BanVQA` (with the counter unless
    ``model.vqa.counter_objects`` is null) with ``model.options.ban`` (glimpses, dropouts,
    attention rank and joint pooling; its size is ``model.vqa.hidden_dim``); any other
    fusion is :class:`~polyfuse.nn.models.vqa.FusionVQA` with ``model.options.<fusion>``.
    Both take the question encoder of ``model.vqa`` (ban-vqa's ``--op c`` with
    ``second_embedding_dim``)."""
    settings = config["model"]["vqa"]
    common = {"hidden_dim": settings["hidden_dim"], "embedding_dim": settings["embedding_dim"],
              "second_embedding_dim": settings["second_embedding_dim"], "word_vectors": word_vectors,
              "classifier_dropout": settings["classifier_dropout"]}
    if config["model"]["fusion"] != "ban":
        return FusionVQA(config["model"]["fusion"], num_words, num_answers, image_dim,
                         fusion_options=fusion_options(config), **common)
    options = dict(config["model"]["options"].get("ban") or {})
    if "hidden_dim" in options:
        raise ValueError("model.options.ban.hidden_dim: VQA's BAN works at model.vqa.hidden_dim (the question "
                         "encoder's size); set that instead")
    return BanVQA(num_words, num_answers, image_dim, counter_objects=settings["counter_objects"], **options, **common)


def build_vqa_task(config: Mapping[str, Any], vocabulary: Mapping[str, Any], image_dim: int, word_vectors=None) -> VQATask:
    """The task of a resolved VQA configuration around a new model."""
    model = build_vqa_model(config, len(vocabulary["words"]), len(vocabulary["answers"]), image_dim,
                            word_vectors=word_vectors)
    return VQATask(
        model, type_names=vocabulary["type_names"], lr=config["optim"]["lr"],
        weight_decay=config["optim"]["weight_decay"], scheduler=config["optim"]["scheduler"],
        max_epochs=config["trainer"]["max_epochs"], optimizer=config["optim"]["optimizer"],
        decay_rate=config["optim"].get("decay_rate"), decay_every=config["optim"].get("decay_every"),
    )  # fmt: skip


@register_task
class VQASpec(TaskSpec):
    """``task.type: vqa`` (docs/VQA.md): questions, answers and image features of
    ``data.vqa``; BAN or another fusion with ``model.vqa``. A checkpoint stores, beside the
    weights and the configuration, the word and answer vocabularies, the type names of
    the breakdown, the PCA of the image features and how those features were made
    (extractor, image size), so that evaluation and prediction, on new images too
    (:mod:`polyfuse.tasks.vqa.new_questions`), encode questions and images as in training."""

    name = "vqa"
    config_sections: ClassVar[dict[str, type]] = {"data.vqa": VQADataConfig, "model.vqa": VQAModelConfig}
    sections = ("data.vqa", "model.vqa")
    required_sections = ("data.vqa",)
    default_monitor = VQATask.default_monitor
    predict_options: ClassVar[dict[str, Any]] = {"images": None, "top_k": 1}
    figure_options: ClassVar[tuple[str, ...]] = ("question_ids", "images")
    path_keys = (
        *(f"data.vqa.{key}" for key in (
            "train_questions", "train_annotations", "test_questions", "test_annotations", "train_features",
            "test_features", "train_features_index", "test_features_index",
        )),
        "model.vqa.glove",
    )  # fmt: skip

    def check_config(self, config: Any) -> None:
        if config.data.source is not None:
            raise ValueError("task.type vqa reads data.vqa; remove data.source")
        if config.model.vqa is None:
            config.model.vqa = VQAModelConfig()

    def build_data(self, config: Mapping[str, Any]) -> TaskData[VQAData]:
        data = build_vqa_data(config)
        for note in data.notes:
            print(note)
        if not len(data.splits["val"]):
            raise ValueError("the validation split is empty")
        datamodule = VQADataModule(
            data, batch_size=config["data"]["batch_size"], eval_batch_size=config["data"]["eval_batch_size"],
            seed=int(config["seed"]), loader=loader_options(config),
        )  # fmt: skip
        samples = {key: len(split) for key, split in data.splits.items()}
        return TaskData(datamodule, data, samples, -(-samples["train"] // config["data"]["batch_size"]))

    def build_module(self, config: Mapping[str, Any], data: TaskData[VQAData]) -> VQATask:
        return build_vqa_task(config, _vocabulary(data.prepared), data.prepared.image_dim, data.prepared.word_vectors)

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[VQAData]) -> dict[str, Any]:
        return {
            "config": dict(config),
            "modalities": ["image", "question"],
            "input_dims": [data.prepared.image_dim, len(data.prepared.words)],
            "label_info": _vocabulary(data.prepared),
            "stats": {},
            # how the training image features were made: new images are extracted alike
            "image_features": feature_settings(config["data"]["vqa"]["train_features"]),
        }

    def module_from_extras(self, extras: Mapping[str, Any]) -> VQATask:
        return build_vqa_task(extras["config"], extras["label_info"], int(extras["input_dims"][0]))

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        images: str | None = None, top_k: int = 1) -> TaskData[VQAData]:
        """A split of the checkpoint's data (``all``: train, val and test when predicting),
        encoded with its own vocabularies and PCA; or new questions: ``source`` a VQA
        questions file about the images of ``images`` (a folder, extracted as the run's
        features were, or a features file); their split is ``new``."""
        answer_count = len(extras["label_info"]["answers"])
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= answer_count:
            raise ValueError(f"--top-k must be an integer in [1, {answer_count}] (the checkpoint's answers), got {top_k!r}")
        if source is not None or images is not None:
            if source is None or images is None or modalities is not None or split not in ("all", NEW_SPLIT) or require_labels:
                raise ValueError(
                    "new questions for a VQA checkpoint take --data QUESTIONS.json and --images DIR (or a features "
                    "file) with polyfuse predict, without --split or --modalities"
                )
            data = new_questions_data(extras, source, images)
        else:
            if modalities is not None:
                raise ValueError("--modalities does not apply to a VQA checkpoint: it reads its data.vqa section")
            if split == "all" and require_labels:
                raise ValueError("evaluate a VQA checkpoint on one split: train, val or test")
            if split not in ("all", "train", "val", "test"):
                raise ValueError(f"a VQA checkpoint is applied to the split train, val, test or all, not {split!r}")
            keys = ["train", "val", "test"] if split == "all" else [split]
            data = build_vqa_data(extras["config"], vocabulary=extras["label_info"], splits=keys)
        datamodule = VQADataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"],
                                   loader=loader_options(extras["config"]))
        return TaskData(datamodule, data, {key: len(part) for key, part in data.splits.items()})

    def loaders(self, data: TaskData[VQAData], split: str) -> dict[str, Any]:
        return {key: data.datamodule.loader(key) for key in data.prepared.splits}

    def bind(self, module: Any, data: TaskData[VQAData], *, images: str | None = None, top_k: int = 1) -> None:
        module.stage_metrics["test"].reset()
        module.predict_top_k = top_k

    def records(self, module: Any, outputs: Mapping[str, Sequence[Any]], data: TaskData[VQAData],
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One record per question: the :data:`PREDICTION_FIELDS`, i.e. the predicted
        ``answer`` and its sigmoid ``score``, its official VQA ``accuracy`` against the human
        answers and the question's ``type`` (new questions: ``split`` ``new``, no
        ``accuracy`` or ``type``); ``answer_<r>, score_<r>`` for the next ranks."""
        prepared, top_k = data.prepared, module.predict_top_k
        records = []
        for key, batches in outputs.items():
            part = prepared.splits[key]
            for output in batches or []:
                for row, answers, scores in zip(output["row"].tolist(), output["answers"].tolist(),
                                                output["scores"].tolist(), strict=True):
                    question, type_index, answer = part.questions[row], int(part.types[row]), answers[0]
                    record = {
                        "split": key,
                        "question_id": question.question_id,
                        "image_id": question.image_id,
                        "question": question.question,
                        "answer": prepared.answers[answer],
                        "score": round(float(scores[0]), 6),
                        "accuracy": float(part.answer_scores[row][part.answer_ids[row] == answer].sum())
                        if question.answers else "",  # new questions have no human answers
                        "type": prepared.type_names[type_index] if type_index >= 0 else "",
                    }  # fmt: skip
                    for rank in range(2, top_k + 1):
                        record[f"answer_{rank}"] = prepared.answers[answers[rank - 1]]
                        record[f"score_{rank}"] = round(float(scores[rank - 1]), 6)
                    records.append(record)
        return records

    def attention_figures(self, module: Any, extras: Mapping[str, Any], out: Path, *, split: str, sample: int,
                          source: str | None, modalities: Sequence[str] | None,
                          question_ids: Sequence[int] | None = None, images: str | None = None) -> list[Path]:
        """BAN's attention maps of questions of ``split`` (those of ``question_ids``, or the
        ``sample``-th) over their images."""
        from polyfuse.tasks.vqa.attention import plot_vqa_checkpoint_attention

        if source or modalities:
            raise ValueError("--data and --modalities do not apply to a VQA checkpoint: it reads its data.vqa section")
        return plot_vqa_checkpoint_attention(
            module, extras, out, question_ids=question_ids, sample=sample, split=split, images=images
        )

    def summary(self, summary: Sequence[Mapping[str, Any]], out_dir: Path) -> str:
        """One table, accuracy overall and per type, and its figure ``summary.png``."""
        from polyfuse.tasks.vqa.report import format_vqa_summary, plot_vqa_summary

        plot_vqa_summary(summary, Path(out_dir) / "summary.png")
        return format_vqa_summary(summary)

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        top_k = 1 + sum(1 for key in (records[0] if records else {}) if key.startswith("answer_"))
        write_csv(Path(path), records, prediction_fields(top_k))
