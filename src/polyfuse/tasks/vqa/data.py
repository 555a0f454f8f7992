"""VQA data for the engine (``task.type: vqa``): questions, vocabularies, image features,
the train / valid / test splits and the Lightning data module that serves them.

Legend for shapes: ``Q`` questions, ``L`` words, ``O`` objects or grid cells, ``d_v``
image feature size, ``A`` answers, ``K`` distinct human answers of a question that are
in the answer vocabulary (padded to the largest).

A batch is a dict: ``tokens`` (B, L) long, ``image`` (B, O, d_v), ``boxes`` (B, O, 4),
``target`` (B, A) soft scores, ``answer_ids`` (B, K) long (-1: padding) and
``answer_scores`` (B, K), the official VQA accuracy of answering ``answer_ids[k]``,
``answer_type`` (B,) long (index into the breakdown's type names) and ``row`` (B,), the
question's position in its split.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from polyfuse.data.datamodule import SplitBatchesDataModule
from polyfuse.data.formats.features import ImageFeatures, RegionFeatures, is_bottom_up, served
from polyfuse.data.formats.vqa import (
    VQAQuestion,
    answer_vocabulary,
    encode_questions,
    load_vqa,
    soft_score_of,
    word_vocabulary,
)
from polyfuse.text import normalize_answer, vqa_accuracy

__all__ = [
    "ANSWER_SOURCES",
    "VQAData",
    "VQADataModule",
    "VQASplit",
    "answer_questions",
    "answer_table",
    "build_vqa_data",
    "encode_split",
    "fit_pca",
    "hold_in_memory",
    "project_features",
    "read_split_features",
    "read_vqa_questions",
    "soft_scores",
    "split_by_image",
]


@dataclass
class VQASplit:
    """One split: the questions as tensors, their images read from ``features`` when a
    batch asks for them (``image_rows``: each question's row there), projected with
    ``pca``. The soft targets are kept beside ``answer_ids`` (the only answers with a
    non-zero target) and made dense per batch: a dense (Q, A) table of VQA 2.0 would
    take 5.5 GB."""

    questions: list[VQAQuestion]
    tokens: Tensor  # (Q, L) long
    answers: int  # A
    answer_ids: Tensor  # (Q, K) long, -1 padding
    answer_scores: Tensor  # (Q, K) official accuracy of each answer
    soft_scores: Tensor  # (Q, K) training target of each answer
    types: Tensor  # (Q,) long
    image_rows: Tensor  # (Q,) long
    features: RegionFeatures | ImageFeatures
    pca: tuple[Tensor, Tensor] | None = None

    def __len__(self) -> int:
        return len(self.questions)

    def targets(self, index: Tensor) -> Tensor:
        """(B, A) soft scores of questions ``index``."""
        ids = self.answer_ids[index]
        dense = torch.zeros(len(ids), self.answers)
        return dense.scatter_add_(1, ids.clamp_min(0), self.soft_scores[index] * (ids >= 0))

    def batch(self, index: Tensor) -> dict[str, Tensor]:
        image, boxes = self.features.read(self.image_rows[index].numpy())
        if self.pca is not None:
            image = project_features(image, *self.pca)
        return {
            "tokens": self.tokens[index],
            "image": image,
            "boxes": boxes,
            "target": self.targets(index),
            "answer_ids": self.answer_ids[index],
            "answer_scores": self.answer_scores[index],
            "answer_type": self.types[index],
            "row": index,
        }


def soft_scores(questions: Sequence[VQAQuestion], answer_ids: Tensor, answers: Sequence[str], soft_score: str) -> Tensor:
    """(Q, K): the training target of each answer of ``answer_ids`` (:func:`answer_table`;
    0 at padding), :func:`~polyfuse.data.formats.vqa.soft_score_of` the number of humans
    who gave it: the non-zero entries of :func:`~polyfuse.data.formats.vqa.soft_targets`."""
    soft_score_of(0, soft_score)  # an unknown rule is refused even without questions
    rows = []
    for question, ids in zip(questions, answer_ids.tolist(), strict=True):
        counts = Counter(normalize_answer(a) for a in question.answers)
        rows.append([soft_score_of(counts[answers[i]], soft_score) if i >= 0 else 0.0 for i in ids])
    return torch.tensor(rows, dtype=torch.float32).reshape(answer_ids.shape)


@dataclass
class VQAData:
    """What a VQA run trains and tests on (see :func:`build_vqa_data`)."""

    splits: dict[str, VQASplit]
    words: list[str]
    answers: list[str]
    type_names: list[str]
    image_dim: int
    pca: tuple[Tensor, Tensor] | None = None  # mean (d_v,), directions (d_v, dim)
    word_vectors: Tensor | None = None  # (V, E) GloVe rows
    notes: list[str] = field(default_factory=list)


def answer_table(questions: Sequence[VQAQuestion], answers: Sequence[str]) -> tuple[Tensor, Tensor]:
    """Per question, the vocabulary answers that some human gave and the official VQA
    accuracy of predicting each (:func:`polyfuse.text.vqa_accuracy`): (Q, K) long
    ids (-1 padding) and (Q, K) accuracies. Predicting any other answer scores 0."""
    index = {a: i for i, a in enumerate(answers)}
    rows: list[list[tuple[int, float]]] = []
    for q in questions:
        given = dict.fromkeys(normalize_answer(a) for a in q.answers)
        rows.append([(index[a], vqa_accuracy(a, q.answers)) for a in given if a in index])
    width = max(1, max((len(r) for r in rows), default=1))
    ids = torch.full((len(rows), width), -1, dtype=torch.long)
    scores = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        for k, (answer, score) in enumerate(row):
            ids[i, k], scores[i, k] = answer, score
    return ids, scores


def _real_rows(features: RegionFeatures | ImageFeatures, rows: Sequence[int], chunk: int) -> Iterator[Tensor]:
    """The real (not all-zero) box rows (n, d_v) of images ``rows`` in order, ``chunk`` images at a time."""
    for start in range(0, len(rows), chunk):
        image, _ = features.read(rows[start : start + chunk])
        flat = image.reshape(-1, image.shape[-1])
        yield flat[flat.abs().sum(dim=1) != 0]


def fit_pca(features: RegionFeatures | ImageFeatures, rows: Sequence[int], dim: int, *, max_rows: int = 20000,
            seed: int = 0, chunk: int = 256) -> tuple[Tensor, Tensor]:
    """Mean (d_v,) and the top ``dim`` principal directions (d_v, dim) of the real
    (not all-zero) box rows of images ``rows`` of ``features``, fitted on at most
    ``max_rows`` of them drawn with ``seed``. Apply with :func:`project_features`.

    Two streaming passes in bounded memory: one counts the real rows, the other keeps
    the drawn ones (the same rows, in the same order, as one array of them all)."""
    total = sum(len(part) for part in _real_rows(features, rows, chunk))
    if not 1 <= dim <= min(total, features.dim):
        raise ValueError(f"data.vqa.feature_dim must lie in [1, {min(total, features.dim)}], got {dim}")
    wanted = None
    if total > max_rows:
        wanted = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:max_rows]
        position = torch.full((total,), -1, dtype=torch.long)
        position[wanted] = torch.arange(max_rows)
    kept, slots, seen = [], [], 0
    for part in _real_rows(features, rows, chunk):
        if wanted is None:
            kept.append(part)
        else:
            slot = position[seen : seen + len(part)]
            kept.append(part[slot >= 0])
            slots.append(slot[slot >= 0])
        seen += len(part)
    rows = torch.cat(kept)
    if wanted is not None:  # in the order of the draw
        drawn = torch.empty_like(rows)
        drawn[torch.cat(slots)] = rows
        rows = drawn
    mean = rows.mean(dim=0)
    centred = (rows - mean).double()
    # Eigenvectors of the (d_v, d_v) scatter matrix: the right singular vectors of the
    # centred rows, at a fraction of an SVD's cost when rows >> d_v.
    _, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
    return mean, vectors[:, -dim:].flip(1).to(rows.dtype).contiguous()


def project_features(features: Tensor, mean: Tensor, directions: Tensor) -> Tensor:
    """(N, O, d_v) -> (N, O, dim): centred and projected; all-zero (padding) rows stay zero."""
    real = (features.abs().sum(dim=-1, keepdim=True) != 0).to(features.dtype)
    return ((features - mean) @ directions) * real


def read_vqa_questions(section: Mapping[str, Any], split: str) -> list[VQAQuestion]:
    """The questions of ``split`` (train / test) named by a ``data.vqa`` section."""
    if section["easy_vqa"]:
        from polyfuse.data.formats.easy_vqa import easy_vqa_questions

        return easy_vqa_questions(split)
    return load_vqa(section[f"{split}_questions"], section[f"{split}_annotations"])


def read_split_features(section: Mapping[str, Any], split: str) -> RegionFeatures:
    """The image features of ``split`` (train / test) named by a ``data.vqa`` section,
    read per batch (:class:`~polyfuse.data.formats.features.RegionFeatures`): a file of
    ``polyfuse extract images``, or with ``<split>_features_index`` a bottom-up file in
    either ban-vqa layout (an adaptive file's images padded per batch to the batch's
    most boxes, bad ``pos_boxes`` refused naming the row and the image id). A bottom-up
    file without its index is an error naming the key to set."""
    path, index = section[f"{split}_features"], section.get(f"{split}_features_index")
    if index is not None:
        return RegionFeatures(path, index)
    if is_bottom_up(path):
        raise ValueError(
            f"data.vqa.{split}_features {path} is a bottom-up features file of ban-vqa (dataset image_features); "
            f"set data.vqa.{split}_features_index to its image-id index, as JSON {{\"<image id>\": row}} or CSV "
            "image_id,row (docs/VQA.md, Image features)"
        )
    return RegionFeatures(path)


def hold_in_memory(
    features: RegionFeatures, pca: tuple[Tensor, Tensor] | None
) -> tuple[RegionFeatures | ImageFeatures, tuple[Tensor, Tensor] | None]:
    """The features batches read and the projection still to apply to them: a file that
    :func:`~polyfuse.data.formats.features.served` holds in memory is projected once (one
    matrix product over every image, as before features were streamed, so that earlier
    runs reproduce to the bit); a larger one is read per batch and projected there."""
    held = served(features)
    if held is features:
        return features, pca
    if pca is not None:
        held.features = project_features(held.features, *pca)
    return held, None


def split_by_image(
    questions: Sequence[VQAQuestion], fraction: float, seed: int
) -> tuple[list[VQAQuestion], list[VQAQuestion]]:
    """(train, val): the questions of a share ``fraction`` of the images (drawn with
    ``seed``, at least one image) go to validation, so that no image is in both."""
    images = sorted({q.image_id for q in questions})
    if len(images) < 2:
        raise ValueError(f"the training questions show {len(images)} image(s); a validation share needs at least 2")
    chosen = max(1, min(len(images) - 1, round(fraction * len(images))))
    held = set(random.Random(seed).sample(images, chosen))
    return [q for q in questions if q.image_id not in held], [q for q in questions if q.image_id in held]


def _type_of(question: VQAQuestion, breakdown: str) -> str:
    return question.answer_type if breakdown == "answer_type" else question.question_type


def encode_split(
    questions: Sequence[VQAQuestion],
    features: RegionFeatures | ImageFeatures,
    data: VQAData,
    section: Mapping[str, Any],
    what: str,
    *,
    pca: tuple[Tensor, Tensor] | None = None,
) -> VQASplit:
    """The :class:`VQASplit` of ``questions`` about the images of ``features``, encoded
    with ``data``'s word and answer vocabularies and type names and the ``data.vqa``
    ``section``'s ``max_length``, ``soft_score`` and ``breakdown``; its batches projected
    with ``pca`` (None: ``features`` are used as they are). ``what`` names the questions
    in the error listing image ids without features."""
    max_length, breakdown = int(section["max_length"]), section["breakdown"]
    image_ids = [q.image_id for q in questions]
    features.check_ids(image_ids, what)  # names every image id without features
    ids, scores = answer_table(questions, data.answers)
    type_index = {name: i for i, name in enumerate(data.type_names)}
    return VQASplit(
        list(questions),
        encode_questions(questions, data.words, max_length=max_length),
        len(data.answers),
        ids,
        scores,
        soft_scores(questions, ids, data.answers, section["soft_score"]),
        torch.tensor([type_index.get(_type_of(q, breakdown), -1) for q in questions], dtype=torch.long),
        torch.tensor([features.rows[i] for i in image_ids], dtype=torch.long),
        features,
        pca,
    )


#: ``data.vqa.answers_from``: whose answers form the answer vocabulary
ANSWER_SOURCES = ("train", "train+val")


def answer_questions(answers_from: str, train: Sequence[VQAQuestion], valid: Sequence[VQAQuestion],
                     test: Sequence[VQAQuestion]) -> list[VQAQuestion]:
    """The questions whose answers :func:`~polyfuse.data.formats.vqa.answer_vocabulary`
    counts (``data.vqa.answers_from``): ``train`` the training split alone; ``train+val``
    ban-vqa's rule, VQA 2.0's train2014 and val2014 annotations together
    (``tools/compute_softscore.py``: 3,129 answers at 9): every annotated question of the
    run, the training and validation splits (``train_annotations``) and the test split
    (``test_annotations``, val2014 in the layout of docs/VQA.md), so that the test split's
    answers shape the vocabulary, as in ban-vqa."""
    if answers_from not in ANSWER_SOURCES:
        raise ValueError(f"answers_from {answers_from!r} is not one of {', '.join(ANSWER_SOURCES)}")
    return [*train] if answers_from == "train" else [*train, *valid, *test]


def build_vqa_data(
    config: Mapping[str, Any],
    *,
    vocabulary: Mapping[str, Any] | None = None,
    splits: Sequence[str] = ("train", "val", "test"),
) -> VQAData:
    """The splits of a resolved ``task.type: vqa`` configuration.

    ``vocabulary`` (stored in a checkpoint: ``words``, ``answers``, ``type_names`` and
    optionally ``pca_mean`` / ``pca_directions``) replaces what would be built from the
    training questions, so that a checkpoint sees its own encoding."""
    section = config["data"]["vqa"]
    # A checkpoint's vocabulary (and PCA) replaces the training files: applied to the
    # test split alone, it reads neither the training questions nor their features.
    reads_training = vocabulary is None or "train" in splits or "val" in splits
    train_questions, valid_questions = split_by_image(
        read_vqa_questions(section, "train"), float(config["data"]["validation_fraction"]), int(config["data"]["split_seed"])
    ) if reads_training else ([], [])  # fmt: skip
    answers_from = section.get("answers_from", "train")
    counts_test = vocabulary is None and answers_from == "train+val"
    test_questions = read_vqa_questions(section, "test") if "test" in splits or counts_test else []
    train_features = read_split_features(section, "train") if reads_training else None
    test_features = read_split_features(section, "test") if "test" in splits else None
    breakdown = section["breakdown"]
    if vocabulary is None:
        words = word_vocabulary(train_questions, min_count=int(section["min_word_count"]))
        answers = answer_vocabulary(
            answer_questions(answers_from, train_questions, valid_questions, test_questions),
            min_count=int(section["min_answer_count"]), count=section["answer_count"],
        )
        if not answers:
            raise ValueError(
                f"no answer occurs data.vqa.min_answer_count = {section['min_answer_count']} times in the "
                f"annotations of data.vqa.answers_from = {answers_from} (counted as data.vqa.answer_count = "
                f"{section['answer_count']})"
            )
        type_names = sorted({_type_of(q, breakdown) for q in train_questions})
        pca = None
        if section["feature_dim"]:
            train_images = sorted({q.image_id for q in train_questions})
            train_features.check_ids(train_images, "training questions")
            pca = fit_pca(train_features, [train_features.rows[i] for i in train_images], int(section["feature_dim"]),
                          seed=int(config["data"]["split_seed"]))
    else:
        words, answers, type_names = list(vocabulary["words"]), list(vocabulary["answers"]), list(vocabulary["type_names"])
        pca = (vocabulary["pca_mean"], vocabulary["pca_directions"]) if "pca_mean" in vocabulary else None
    read = train_features if train_features is not None else test_features
    data = VQAData({}, words, answers, type_names, int(pca[1].shape[1]) if pca is not None else read.dim, pca)
    train_served = hold_in_memory(train_features, pca) if train_features is not None else None
    sources = {
        "train": (train_questions, train_served, "training questions"),
        "val": (valid_questions, train_served, "validation questions"),
        "test": (test_questions, hold_in_memory(test_features, pca) if test_features is not None else None,
                 "test questions"),
    }
    for key in splits:
        questions, (features, batch_pca), what = sources[key]
        data.splits[key] = encode_split(questions, features, data, section, what, pca=batch_pca)
    glove = config["model"]["vqa"]["glove"] if config["model"].get("vqa") else None
    if glove and vocabulary is None:
        from polyfuse.data.formats.glove import load_glove

        data.word_vectors, found = load_glove(glove, words)
        data.notes.append(f"{found} of {len(words)} words found in {Path(glove).name}")
    return data


class VQADataModule(SplitBatchesDataModule):
    """Serves the splits of a :class:`VQAData` as batches of the module docstring
    (:class:`~polyfuse.data.datamodule.SplitBatchesDataModule`)."""
