"""The VQA accuracy of Antol et al. (ICCV 2015) as the official VQA 2.0 evaluation computes it.

The answer rules of the official script (whitespace, :func:`normalize_answer` only when
the human answers differ, the mean over the ten leave-one-out subsets of nine humans of
``min(#matching / 3, 1)``) live in :mod:`polyfuse.text`, which the data use too (the
answer vocabulary, the soft targets, each candidate answer's accuracy); they are
re-exported here as the functional side of the metric.

Per-type breakdowns (yes/no, number, other; question types) average each question's
accuracy, as the official script does.

:func:`soft_score` is the training target of BAN and its predecessors,
``min(#humans that gave the answer / 3, 1)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

# The official answer rules, shared with the data; part of this module's API.
from polyfuse.text import normalize_answer, process_digit_article, process_punctuation, vqa_accuracy

__all__ = [
    "VQAAccuracy",
    "normalize_answer",
    "process_digit_article",
    "process_punctuation",
    "soft_score",
    "vqa_accuracy",
]


def soft_score(count: int | float) -> float:
    """Training target of an answer given by ``count`` humans: min(count / 3, 1)."""
    if count < 0:
        raise ValueError(f"soft_score: count must be >= 0, got {count}")
    return min(count / 3.0, 1.0)


class VQAAccuracy:
    """Accumulates official VQA accuracy overall and per answer / question type.

    ``update(predictions, answers, answer_types, question_types)`` takes lists of
    one entry per question; ``compute()`` returns percentages:
    ``{"overall": ..., "per_answer_type": {...}, "per_question_type": {...}}``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._scores: list[float] = []
        self._by_answer_type: dict[str, list[float]] = defaultdict(list)
        self._by_question_type: dict[str, list[float]] = defaultdict(list)

    def update(
        self,
        predictions: Sequence[str],
        answers: Sequence[Sequence[str]],
        answer_types: Sequence[str] | None = None,
        question_types: Sequence[str] | None = None,
    ) -> None:
        if len(predictions) != len(answers):
            raise ValueError(
                f"VQAAccuracy.update: {len(predictions)} predictions but {len(answers)} answer lists"
            )
        for name, types in [("answer_types", answer_types), ("question_types", question_types)]:
            if types is not None and len(types) != len(predictions):
                raise ValueError(
                    f"VQAAccuracy.update: {name} has {len(types)} entries, expected {len(predictions)}"
                )
        for index, (prediction, human) in enumerate(zip(predictions, answers, strict=True)):
            score = vqa_accuracy(prediction, human)
            self._scores.append(score)
            if answer_types is not None:
                self._by_answer_type[answer_types[index]].append(score)
            if question_types is not None:
                self._by_question_type[question_types[index]].append(score)

    def compute(self) -> dict[str, float | Mapping[str, float]]:
        if not self._scores:
            raise ValueError("VQAAccuracy.compute: no question was added")

        def percent(scores: Sequence[float]) -> float:
            return 100.0 * sum(scores) / len(scores)

        return {
            "overall": percent(self._scores),
            "per_answer_type": {k: percent(v) for k, v in sorted(self._by_answer_type.items())},
            "per_question_type": {k: percent(v) for k, v in sorted(self._by_question_type.items())},
        }
