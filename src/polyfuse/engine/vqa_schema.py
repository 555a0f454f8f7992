"""Configuration sections of ``task.type: vqa`` (visual question answering, docs/VQA.md).

``data.vqa`` says where the questions, answers and image features come from and how
the vocabularies are built; ``model.vqa`` sizes the question encoder, BAN and the
classifier. Both are part of :class:`polyfuse.engine.schema.RunConfig` (strict: unknown
keys are errors); :func:`check_vqa_config` ties them to ``task.type``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polyfuse.engine.sizes import SizeInt

__all__ = ["VQADataConfig", "VQAModelConfig", "check_vqa_config"]

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
    """VQA model (task.type vqa): question encoder, BAN's glimpses and counter; other fusions: model.options."""

    hidden_dim: SizeInt = Field(1024, description="H: question GRU and joint representation size (the paper: 1024)")
    embedding_dim: SizeInt = Field(300, description="word embedding size (300, GloVe's)")
    glove: str | None = Field(None, description="GloVe-format text file initialising the word embedding (relative to the config file)")
    second_embedding_dim: SizeInt | None = Field(
        None, description="size of a second trained word embedding concatenated to the first before the GRU (ban-vqa's --op c, its default and the released BAN-Glove-Counter: 300); null: one embedding"
    )
    glimpses: SizeInt = Field(8, description="BAN glimpses G (the paper: 8)")
    counter_objects: SizeInt | None = Field(10, description="BAN: objects kept by the counting module (ban-vqa: 10); null: no counter")
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.2, description="BAN: dropout before its linear maps (ban-vqa: 0.2)")
    attention_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.5, description="BAN: dropout inside the attention (ban-vqa: 0.5)")
    classifier_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.5, description="dropout of the two-layer classifier (ban-vqa: 0.5)")


def check_vqa_config(config: Any) -> None:
    """``task.type: vqa`` needs ``data.vqa`` and takes no ``data.source``; the VQA
    sections belong to that task type only. ``config`` is a validated RunConfig."""
    is_vqa = config.task.type == "vqa"
    if is_vqa and config.data.vqa is None:
        raise ValueError("task.type vqa needs a data.vqa section (questions, answers and image features)")
    if is_vqa and config.data.source is not None:
        raise ValueError("task.type vqa reads data.vqa; remove data.source")
    if not is_vqa:
        for where, section in (("data.vqa", config.data.vqa), ("model.vqa", config.model.vqa)):
            if section is not None:
                raise ValueError(f"{where} is only used by task.type vqa (task.type is {config.task.type!r})")
