"""Configuration sections of ``task.type: captioning`` (video captioning, HOCA section 4.4).

``captioning``: the data (one feature file per modality, captions, splits), the
vocabulary and the generation settings. ``decoder``: the encoder-decoder and its
attention variant (the section a ``polyfuse compare`` model file replaces).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from polyfuse.engine.sizes import SizeInt

__all__ = ["VARIANTS", "CaptioningConfig", "DecoderConfig", "variant_settings"]

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


#: the size of MiniLM's word-piece embeddings (polyfuse.data.formats.word_vectors; no torch import here)
MINILM_DIM = 384


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
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.5, description="dropout on the LSTM input and output (paper: 0.5)")

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
