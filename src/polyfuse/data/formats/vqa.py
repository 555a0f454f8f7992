"""VQA 2.0 files: questions and annotations JSON, vocabularies, encoded tensors.

The format (visualqa.org/download.html): a questions file
``{"questions": [{"question_id", "image_id", "question"}, ...]}`` and an annotations
file ``{"annotations": [{"question_id", "image_id", "answers": [{"answer": ...} x 10],
"multiple_choice_answer", "answer_type", "question_type"}, ...]}`` (VQA 2.0's
``multiple_choice_answer`` is the most frequent of the ten human answers).

Legend for shapes: ``Q`` questions, ``L`` words per question (``max_length``),
``A`` answers of the vocabulary.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from sys import intern
from typing import Any

import torch
from torch import Tensor

from polyfuse.data.formats.jsonfile import entry_field, iter_json_list
from polyfuse.text import normalize_answer, tokenize_question

__all__ = [
    "ANSWER_COUNTS",
    "SOFT_SCORES",
    "UNKNOWN_WORD",
    "VQAQuestion",
    "answer_vocabulary",
    "encode_questions",
    "load_vqa",
    "question_answer",
    "soft_score_of",
    "soft_targets",
    "word_vocabulary",
]


@dataclass(frozen=True, slots=True)
class VQAQuestion:
    """One question with its human answers (raw strings, as annotated)."""

    question_id: int
    image_id: int
    question: str
    answers: tuple[str, ...]
    answer_type: str
    question_type: str
    multiple_choice_answer: str | None = None  # as annotated; None: the file has none


def _read_json(path: Path, key: str) -> Iterator[Any]:
    """The entries of the file's list, one at a time (bounded memory for VQA 2.0's files)."""
    if not path.is_file() and not path.is_dir():
        raise FileNotFoundError(f"VQA file {path} does not exist")
    return iter_json_list(path, key)


def load_vqa(
    questions_path: str | Path, annotations_path: str | Path, *, answers_per_question: int | None = 10
) -> list[VQAQuestion]:
    """Questions joined with their annotations, in the order of the questions file.

    Raises:
        ValueError: a missing field (naming the file, entry and field), an answer
            list whose length is not ``answers_per_question`` (None accepts any
            non-empty list), a question without annotation.
    """
    questions_path, annotations_path = Path(questions_path), Path(annotations_path)
    annotations: dict[int, VQAQuestion] = {}
    for index, entry in enumerate(_read_json(annotations_path, "annotations")):
        question_id = entry_field(entry, "question_id", annotations_path, index, int)
        answers = entry_field(entry, "answers", annotations_path, index, list)
        if (answers_per_question is not None and len(answers) != answers_per_question) or not answers:
            raise ValueError(
                f"{annotations_path}: entry {index} (question_id {question_id}) has {len(answers)} "
                f"answers, expected {answers_per_question}"
            )
        # answers and types repeat across questions: one string object each (intern)
        texts = tuple(
            intern(entry_field(answer, "answer", annotations_path, index, str))
            if isinstance(answer, Mapping)
            else intern(entry_field({"answer": answer}, "answer", annotations_path, index, str))
            for answer in answers
        )
        choice = (
            intern(entry_field(entry, "multiple_choice_answer", annotations_path, index, str))
            if "multiple_choice_answer" in entry
            else None
        )
        annotations[question_id] = VQAQuestion(
            question_id,
            entry_field(entry, "image_id", annotations_path, index, int),
            "",
            texts,
            intern(str(entry.get("answer_type", "other"))),
            intern(str(entry.get("question_type", ""))),
            choice,
        )
    result = []
    for index, entry in enumerate(_read_json(questions_path, "questions")):
        question_id = entry_field(entry, "question_id", questions_path, index, int)
        if question_id not in annotations:
            raise ValueError(
                f"{questions_path}: question_id {question_id} (entry {index}) has no annotation in "
                f"{annotations_path}"
            )
        annotation = annotations[question_id]
        image_id = entry_field(entry, "image_id", questions_path, index, int)
        if image_id != annotation.image_id:
            raise ValueError(
                f"{questions_path}: question_id {question_id} has image_id {image_id} but its "
                f"annotation says {annotation.image_id}"
            )
        text = entry_field(entry, "question", questions_path, index, str)
        result.append(
            VQAQuestion(
                question_id,
                image_id,
                text,
                annotation.answers,
                annotation.answer_type,
                annotation.question_type,
                annotation.multiple_choice_answer,
            )
        )
    return result


#: The word that stands for every word outside the vocabulary: the last entry of
#: :func:`word_vocabulary`, index V - 1 of an embedding of V + 1 rows (V: padding), the
#: index ban-vqa's ``Dictionary.tokenize`` gives unknown words (``padding_idx - 1``, its
#: least frequent word). Training questions' words seen fewer than ``min_count`` times
#: are encoded as it, so that its embedding row is trained.
UNKNOWN_WORD = "<unk>"


def word_vocabulary(questions: Sequence[VQAQuestion], *, min_count: int = 2) -> list[str]:
    """Words occurring at least ``min_count`` times, most frequent first (ties
    alphabetical), then :data:`UNKNOWN_WORD`."""
    counts = Counter(word for q in questions for word in tokenize_question(q.question))
    counts.pop(UNKNOWN_WORD, None)
    return [*sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w)), UNKNOWN_WORD]


#: How :func:`answer_vocabulary` counts an answer: ``multiple_choice`` counts the questions
#: whose multiple-choice answer it is (BAN section 5.3, "the minimum occurrence of the answer
#: in unique questions"; ban-vqa's ``filter_answers``); ``all_answers`` counts every human
#: answer (ten per VQA 2.0 question).
ANSWER_COUNTS = ("multiple_choice", "all_answers")


def question_answer(question: VQAQuestion) -> str:
    """The normalised answer a question stands for in the answer vocabulary: its
    ``multiple_choice_answer`` when the annotation has one, else (as VQA 2.0 defines
    that field) the most frequent of its normalised human answers, a tie going to the
    answer given first."""
    if question.multiple_choice_answer is not None:
        return normalize_answer(question.multiple_choice_answer)
    if not question.answers:
        raise ValueError(f"question_id {question.question_id} has neither answers nor a multiple_choice_answer")
    counts = Counter(normalize_answer(a) for a in question.answers)  # insertion order breaks ties
    return max(counts, key=counts.__getitem__)


def answer_vocabulary(
    questions: Sequence[VQAQuestion], *, min_count: int = 9, count: str = "multiple_choice"
) -> list[str]:
    """Normalised answers occurring at least ``min_count`` times, most frequent first
    (ties alphabetical).

    ``count="multiple_choice"`` (the paper's and ban-vqa's rule, which keeps answers of
    9 questions or more) counts each question once, for its :func:`question_answer`;
    ``"all_answers"`` counts every human answer. The answers come from ``questions``
    alone: ban-vqa's 3,129 answers on VQA 2.0 are this rule over the training and
    validation questions together, while the VQA task (:mod:`polyfuse.tasks.vqa.data`)
    passes its training questions by default, which gives another count (docs/VQA.md).
    """
    if count == "multiple_choice":
        counts = Counter(question_answer(q) for q in questions)
    elif count == "all_answers":
        counts = Counter(normalize_answer(a) for q in questions for a in q.answers)
    else:
        raise ValueError(f"answer count {count!r} is not one of {', '.join(ANSWER_COUNTS)}")
    return sorted((a for a, c in counts.items() if c >= min_count), key=lambda a: (-counts[a], a))


def encode_questions(
    questions: Sequence[VQAQuestion], words: Sequence[str], *, max_length: int = 14
) -> Tensor:
    """Word indices, (Q, L) long: the first ``max_length`` words, padded at the end with
    ``len(words)`` (the padding index, as in ban-vqa's embedding of ``ntoken + 1`` rows).

    A word outside ``words`` gets the index of :data:`UNKNOWN_WORD`, which every
    vocabulary of :func:`word_vocabulary` ends with."""
    index = {w: i for i, w in enumerate(words)}
    padding = len(words)
    if UNKNOWN_WORD not in index:
        raise ValueError(f"the word vocabulary has no {UNKNOWN_WORD} entry (polyfuse.data.formats.vqa.word_vocabulary "
                         "adds it)")
    unknown = index[UNKNOWN_WORD]
    tokens = torch.full((len(questions), max_length), padding, dtype=torch.long)
    for row, q in enumerate(questions):
        ids = [index.get(w, unknown) for w in tokenize_question(q.question)][:max_length]
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return tokens


#: Training targets of an answer given by n humans: ``ban_vqa``, 0.3 / 0.6 / 0.9 / 1 for
#: n = 1 / 2 / 3 / 4 or more (ban-vqa's ``tools/compute_softscore.py`` ``get_score``: with
#: ten answers, the official accuracy averaged over the ten sets of nine, e.g.
#: 9/10 x 1/3 = 0.3 for n = 1); ``min_third``, min(n / 3, 1) (the accuracy on all ten).
SOFT_SCORES = ("ban_vqa", "min_third")


def soft_score_of(count: int, rule: str = "ban_vqa") -> float:
    """The training target of an answer given by ``count`` humans under ``rule``
    (:data:`SOFT_SCORES`)."""
    if count < 0:
        raise ValueError(f"soft score: count must be >= 0, got {count}")
    if rule == "ban_vqa":
        return (0.0, 0.3, 0.6, 0.9)[count] if count < 4 else 1.0
    if rule == "min_third":
        return min(count / 3.0, 1.0)
    raise ValueError(f"soft score {rule!r} is not one of {', '.join(SOFT_SCORES)}")


def soft_targets(questions: Sequence[VQAQuestion], answers: Sequence[str], *, soft_score: str = "ban_vqa") -> Tensor:
    """(Q, A) float: for each answer of the vocabulary, :func:`soft_score_of` the number
    of humans who gave it (normalised answers; answers outside the vocabulary get no
    column)."""
    soft_score_of(0, soft_score)  # an unknown rule is refused even without questions
    index = {a: i for i, a in enumerate(answers)}
    targets = torch.zeros(len(questions), len(answers))
    for row, q in enumerate(questions):
        for answer, count in Counter(normalize_answer(a) for a in q.answers).items():
            if answer in index:
                targets[row, index[answer]] = soft_score_of(count, soft_score)
    return targets
