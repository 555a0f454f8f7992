"""VQA accuracy against hand-computed values of the official evaluation."""

from __future__ import annotations

import pytest

from polyfuse.metrics.vqa import VQAAccuracy, normalize_answer, soft_score, vqa_accuracy


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Two", "2"),
        ("the red one.", "red 1"),
        ("An apple", "apple"),
        ("dont know", "don't know"),
        ("yes!", "yes!"),  # "!" is not in the official list
        ("10,000", "10000"),  # comma between digits: every mark is removed
        ("3.5", "3.5"),  # a period before a digit stays
        ("black/white", "black white"),
        ("black / white", "black white"),
        ("  Tennis\tracket ", "tennis racket"),
    ],
)
def test_normalisation(raw, expected):
    assert normalize_answer(raw) == expected


def test_accuracy_hand_computed():
    # 2 of 10 humans say "2": leaving out one of those two leaves 1 match (1/3),
    # leaving out any of the 8 others leaves 2 matches (2/3): (2 * 1/3 + 8 * 2/3) / 10.
    answers = ["2", "2"] + ["3"] * 8
    assert vqa_accuracy("two", answers) == pytest.approx((2 / 3 + 16 / 3) / 10)
    # 3 humans agree: 3 leave-outs give 2/3, 7 give 1 -> 0.9
    assert vqa_accuracy("yes", ["yes"] * 3 + ["no"] * 7) == pytest.approx(0.9)
    assert vqa_accuracy("yes", ["yes"] * 4 + ["no"] * 6) == pytest.approx(1.0)
    assert vqa_accuracy("maybe", ["yes"] * 10) == 0.0
    assert vqa_accuracy("Yes.", ["yes"] * 10) == 1.0


def test_soft_score():
    assert [soft_score(n) for n in range(5)] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])
    with pytest.raises(ValueError):
        soft_score(-1)


def test_per_type_breakdown():
    metric = VQAAccuracy()
    metric.update(
        ["yes", "2", "red"],
        [["yes"] * 10, ["2", "2"] + ["3"] * 8, ["blue"] * 10],
        answer_types=["yes/no", "number", "other"],
        question_types=["is there", "how many", "what color"],
    )
    metric.update(["no"], [["no"] * 3 + ["yes"] * 7], answer_types=["yes/no"], question_types=["is there"])
    result = metric.compute()
    number = (2 / 3 + 16 / 3) / 10
    assert result["overall"] == pytest.approx(100 * (1 + number + 0 + 0.9) / 4)
    assert result["per_answer_type"] == pytest.approx({"yes/no": 95.0, "number": 100 * number, "other": 0.0})
    assert result["per_question_type"]["is there"] == pytest.approx(95.0)


def test_bad_input():
    with pytest.raises(ValueError, match="no human answers"):
        vqa_accuracy("yes", [])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        VQAAccuracy().update(["a", "b"], [["a"]])
