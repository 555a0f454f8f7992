"""The VQA accuracy of Antol et al. (ICCV 2015) as the official evaluation computes it.

``vqa_accuracy(prediction, answers)`` averages ``min(#matches / 3, 1)`` over the ten
leave-one-out subsets of nine human answers (github.com/GT-Vision-Lab/VQA,
``vqaEval.py``); the prediction goes through the official normalisation first
(:func:`normalize_answer`: punctuation, number words to digits, articles removed,
missing apostrophes of contractions restored), and the human answers through its
punctuation step when they are not all equal, as the official script does.

Per-type breakdowns (yes/no, number, other) average each question's accuracy. The
official script's per-type numbers use the last leave-one-out term of a question
instead of its mean (a known quirk); the overall accuracy is the same in both.

:func:`soft_score` is the training target of BAN and its predecessors,
``min(#humans that gave the answer / 3, 1)``.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

__all__ = ["VQAAccuracy", "normalize_answer", "process_punctuation", "soft_score", "vqa_accuracy"]

_NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
    "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
_ARTICLES = frozenset({"a", "an", "the"})
_PUNCTUATION = [";", ":", "/", "'", "[", "]", '"', "(", ")", "=", "+", "\\", "_", ">", "<", "@", "`", ",", "?"]
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # a period not followed by a digit
_COMMA_BETWEEN_DIGITS = re.compile(r"(\d)(,)(\d)")
# Contracted forms of the official table; the key is the form without apostrophes
# ("dont" -> "don't"). The official table writes most of them with a typographic
# apostrophe; here all use "'".
_CONTRACTED = ["ain't", "aren't", "can't", "could've", "couldn't", "couldn't've", "didn't", "doesn't", "don't", "hadn't", "hadn't've", "hasn't", "haven't", "he'd", "he'd've", "he's", "how'd", "how'll", "how's", "i'd've", "i'm", "i've", "isn't", "it'd", "it'd've", "it'll", "ma'am", "mightn't", "mightn't've", "might've", "mustn't", "must've", "needn't", "not've", "o'clock", "oughtn't", "shan't", "she'd've", "should've", "shouldn't", "shouldn't've", "somebody'd've", "somebody'll", "somebody's", "someone'd", "someone'd've", "someone'll", "someone's", "something'd", "something'd've", "something'll", "that's", "there'd", "there'd've", "there're", "there's", "they'd", "they'd've", "they'll", "they're", "they've", "'twas", "wasn't", "we'd've", "we've", "weren't", "what'll", "what're", "what's", "what've", "when's", "where'd", "where's", "where've", "who'd", "who'd've", "who'll", "who's", "who've", "why'll", "why're", "why's", "won't", "would've", "wouldn't", "wouldn't've", "y'all", "y'all'll", "y'all'd've", "you'd", "you'd've", "you'll", "you're", "you've"]
_CONTRACTIONS = {form.replace("'", ""): form for form in _CONTRACTED}


@functools.lru_cache(maxsize=1 << 16)  # answers repeat: VQA 2.0 has ~4M answers, far fewer distinct ones
def process_punctuation(text: str) -> str:
    """The official punctuation step: a mark next to a space (or any mark in a text
    with a comma between digits) is removed, any other is replaced by a space; a
    period not followed by a digit is removed."""
    out = text
    strip_all = _COMMA_BETWEEN_DIGITS.search(text) is not None
    for mark in _PUNCTUATION:
        if strip_all or mark + " " in text or " " + mark in text:
            out = out.replace(mark, "")
        else:
            out = out.replace(mark, " ")
    return _PERIOD.sub("", out)


@functools.lru_cache(maxsize=1 << 16)
def normalize_answer(text: str) -> str:
    """The official normalisation of an answer: whitespace, punctuation, lower case,
    number words to digits, articles dropped, contractions given their apostrophe.

    >>> normalize_answer("Two dogs.")
    '2 dogs'
    """
    text = text.replace("\n", " ").replace("\t", " ").strip()
    words = []
    for word in process_punctuation(text).lower().split():
        word = _NUMBER_WORDS.get(word, word)
        if word not in _ARTICLES:
            words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Official VQA accuracy of one prediction against the human answers, in [0, 1].

    ``mean over i of min(#{j != i : answers[j] == prediction} / 3, 1)``.

    Raises:
        ValueError: ``answers`` is empty.
    """
    if len(answers) == 0:
        raise ValueError("vqa_accuracy: the question has no human answers")
    prediction = normalize_answer(prediction)
    if len(set(answers)) > 1:
        answers = [process_punctuation(answer) for answer in answers]
    matches = sum(answer == prediction for answer in answers)
    total = 0.0
    for answer in answers:  # leave this human out
        total += min((matches - (answer == prediction)) / 3.0, 1.0)
    return total / len(answers)


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
