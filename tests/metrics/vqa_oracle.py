"""The tests' oracle for the VQA accuracy: the official evaluation on answer strings.

Scores every prediction with :func:`polyfuse.text.vqa_accuracy` (the official rules,
checked by hand in test_vqa_metric.py) and averages overall, per answer type and per
question type as the official script does, in percent. It shares nothing with
:class:`polyfuse.metrics.vqa.VQAScore` (which looks predicted answer indices up in a
candidate table), so the two check each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from polyfuse.text import vqa_accuracy


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
