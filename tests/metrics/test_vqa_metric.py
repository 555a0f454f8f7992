"""VQA accuracy against hand-computed values of the official evaluation, and the
training-time VQAScore against the official evaluation on answer strings (the oracle of
tests/metrics/vqa_oracle.py)."""

from __future__ import annotations

import pytest
import torch
from tests.metrics.vqa_oracle import VQAAccuracy
from tests.tiny.vqa import VOCABULARY, random_questions

from polyfuse.metrics.vqa import VQAScore, soft_score
from polyfuse.tasks.vqa.data import answer_table
from polyfuse.text import normalize_answer, process_digit_article, process_punctuation, vqa_accuracy


# Expected values worked out by hand from the rules of the official VQA 2.0 script
# (GT-Vision-Lab/VQA, vqaEval.py since a013f00); each comment names the rule that decides.
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Two", "2"),  # lower case, then number word -> digit
        ("the red one.", "red 1"),  # final period removed, article dropped, "one" -> "1"
        ("An apple", "apple"),  # article
        ("none", "0"),  # number word "none"
        ("dont know", "don't know"),  # contraction table: "dont" -> "don't"
        ("don't know", "don't know"),  # "'" is not a punctuation mark of the list
        ("mcdonald's", "mcdonald's"),  # idem
        ("Im", "im"),  # the table's key "Im" is capitalised, words are lower-cased first
        ("somebody'd", "somebodyd"),  # the table maps "somebody'd" -> "somebodyd" (sic)
        ("yes!", "yes"),  # "!" not next to a space: replaced by a space, then split away
        ("why?", "why"),  # "?" likewise
        ("t-shirt", "t shirt"),  # "-" not next to a space: replaced by a space
        ("t - shirt", "t shirt"),  # "-" next to a space: removed (the spaces collapse)
        ("e-mail - inbox", "email inbox"),  # " -" occurs: every "-" of the text is removed
        ("10:30", "10:30"),  # ":" is not in the list
        ("50%", "50%"),  # "%" is not in the list
        ("1,000", "1000"),  # comma between digits: every mark is removed
        ("1,000 dollars!", "1000 dollars"),  # idem, "!" removed rather than spaced
        ("red,white", "red white"),  # comma without digits or spaces: a space
        ("red, white", "red white"),  # ", " occurs: removed
        ("3.5", "3.5"),  # a period followed by a digit stays
        (".5", ".5"),  # idem
        ("it is 3.", "it is 3"),  # a period at the end is removed
        ("a.m.", "am"),  # periods not followed by a digit are removed, not spaced
        ("(left)", "left"),  # parentheses not next to a space: spaces
        ("black/white", "black white"),  # "/" not next to a space: a space
        ("black / white", "black white"),  # "/" next to a space: removed
        ("  Tennis\tracket ", "tennis racket"),  # tab -> space, stripped, lower case
        ("." * 40, "." * 8),  # re.UNICODE (32) is passed as sub's count: 32 periods removed
        # Python 2's \d is ASCII: a period before an Arabic-Indic digit is removed
        ("\u0663.\u0665", "\u0663\u0665"),
    ],
)
def test_normalisation(raw, expected):
    assert normalize_answer(raw) == expected


def test_process_steps_apart():
    # processPunctuation keeps case and spaces; processDigitArticle does not punctuate.
    assert process_punctuation("Yes!") == "Yes "
    assert process_punctuation("a  b") == "a  b"
    assert process_digit_article("The Two-dogs!") == "two-dogs!"  # one word, not a number word
    assert process_digit_article("The Two dogs!") == "2 dogs!"


@pytest.mark.parametrize(
    ("prediction", "humans", "expected"),
    [
        # All ten humans gave the same string: nothing is normalised, exact match only.
        ("don't know", ["don't know"] * 10, 1.0),
        ("can't", ["can't"] * 10, 1.0),
        ("mcdonald's", ["mcdonald's"] * 10, 1.0),
        ("men's", ["men's"] * 10, 1.0),
        ("yes", ["yes"] * 10, 1.0),
        ("yes!", ["yes"] * 10, 0.0),
        ("Yes.", ["yes"] * 10, 0.0),
        ("t-shirt", ["t shirt"] * 10, 0.0),
        ("2", ["Two"] * 10, 0.0),
        ("Two", ["Two"] * 10, 1.0),
        # ... after whitespace cleaning: " yes\n" and "yes" are the same string, and so are
        # "red\nwhite", "red\twhite" and "red white" (newline and tab become a space).
        ("yes\t", [" yes\n"] + ["yes"] * 9, 1.0),
        ("red white", ["red\nwhite"] * 10, 1.0),
        ("red white", ["red\twhite"] * 10, 1.0),
        ("red\nwhite", ["red white"] * 10, 1.0),
        ("red\twhite", ["red white"] * 10, 1.0),
        ("red  white", ["red white"] * 10, 0.0),  # inner spaces are not collapsed
        # Humans differ: prediction and humans normalised. 9 matches: every leave-one-out >= 3.
        ("yes!", ["yes"] * 9 + ["no"], 1.0),
        # "t-shirt" -> "t shirt": 5 matches, every leave-one-out >= 4.
        ("t-shirt", ["t shirt"] * 5 + ["shirt"] * 5, 1.0),
        # humans "t-shirt" -> "t shirt": 2 matches; (2 * 1/3 + 8 * 2/3) / 10 = 0.6.
        ("t shirt", ["t-shirt"] * 2 + ["shirt"] * 8, 0.6),
        # humans "two" -> "2" (processDigitArticle on the humans too): 0.6.
        ("2", ["two"] * 2 + ["3"] * 8, 0.6),
        # article dropped in the humans: 3 matches; (3 * 2/3 + 7 * 1) / 10 = 0.9.
        ("dog", ["the dog"] * 3 + ["cat"] * 7, 0.9),
        # contraction restored in the humans: 3 matches -> 0.9.
        ("don't know", ["dont know"] * 3 + ["no"] * 7, 0.9),
        # comma between digits: "1,000" -> "1000", 4 matches -> 1.0.
        ("1,000", ["1000"] * 4 + ["100"] * 6, 1.0),
        # "3." -> "3": 7 matches -> 1.0; "3.5" keeps its period: 3 matches -> 0.9.
        ("3.", ["3.5"] * 3 + ["3"] * 7, 1.0),
        ("3.5", ["3.5"] * 3 + ["3"] * 7, 0.9),
        # ":" is kept: "10:30" matches only "10:30" (3 humans) -> 0.9.
        ("10:30", ["10:30"] * 3 + ["10 30"] * 7, 0.9),
        # 1 match: 1 leave-out gives 0, 9 give 1/3 -> 0.3.
        ("red", ["red"] + ["blue"] * 9, 0.3),
    ],
)
def test_official_accuracy(prediction, humans, expected):
    assert vqa_accuracy(prediction, humans) == pytest.approx(expected)


def test_accuracy_hand_computed():
    # 2 of 10 humans say "2": leaving out one of those two leaves 1 match (1/3),
    # leaving out any of the 8 others leaves 2 matches (2/3): (2 * 1/3 + 8 * 2/3) / 10.
    answers = ["2", "2"] + ["3"] * 8
    assert vqa_accuracy("two", answers) == pytest.approx((2 / 3 + 16 / 3) / 10)
    # 3 humans agree: 3 leave-outs give 2/3, 7 give 1 -> 0.9
    assert vqa_accuracy("yes", ["yes"] * 3 + ["no"] * 7) == pytest.approx(0.9)
    assert vqa_accuracy("yes", ["yes"] * 4 + ["no"] * 6) == pytest.approx(1.0)
    assert vqa_accuracy("maybe", ["yes"] * 10) == 0.0
    # Fewer than ten humans: the mean is over as many leave-one-out subsets.
    assert vqa_accuracy("a", ["a", "a", "b"]) == pytest.approx((1 / 3 + 1 / 3 + 2 / 3) / 3)


def test_soft_score():
    assert [soft_score(n) for n in range(5)] == pytest.approx([0, 1 / 3, 2 / 3, 1, 1])
    with pytest.raises(ValueError, match=r"^soft_score: count must be >= 0, got -1$"):
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


def test_without_types_only_overall():
    metric = VQAAccuracy()
    metric.update(["yes", "no"], [["yes"] * 10, ["yes"] * 10])
    assert metric.compute() == {"overall": pytest.approx(50.0), "per_answer_type": {}, "per_question_type": {}}
    metric.reset()
    with pytest.raises(ValueError, match=r"^VQAAccuracy.compute: no question was added$"):
        metric.compute()


def test_bad_input():
    with pytest.raises(ValueError, match=r"^vqa_accuracy: the question has no human answers$"):
        vqa_accuracy("yes", [])
    with pytest.raises(ValueError, match=r"^VQAAccuracy.update: 2 predictions but 1 answer lists$"):
        VQAAccuracy().update(["a", "b"], [["a"]])
    for name in ["answer_types", "question_types"]:
        for types in (["x"], ["x", "y", "z"]):  # too few, too many
            with pytest.raises(ValueError, match=rf"^VQAAccuracy.update: {name} has {len(types)} entries, expected 2$"):
                VQAAccuracy().update(["a", "b"], [["a"], ["b"]], **{name: types})


def test_vqa_score_equals_the_official_accuracy():
    questions = random_questions(60, seed=0)
    ids, scores = answer_table(questions, VOCABULARY)
    types = ["number", "other", "yes/no"]
    type_index = torch.tensor([types.index(q.answer_type) for q in questions])
    predicted = torch.randint(0, len(VOCABULARY), (len(questions),), generator=torch.Generator().manual_seed(1))
    metric = VQAScore(types)
    for batch in (slice(0, 25), slice(25, 60)):  # accumulated over batches
        metric.update(predicted[batch], ids[batch], scores[batch], type_index[batch])
    values = metric.compute()
    oracle = VQAAccuracy()  # the official evaluation on the answer strings
    oracle.update([VOCABULARY[p] for p in predicted.tolist()], [q.answers for q in questions],
                  [q.answer_type for q in questions])  # fmt: skip
    expected = oracle.compute()
    assert float(values["acc"]) == pytest.approx(expected["overall"] / 100, abs=1e-6)
    for name in types:
        assert float(values[f"acc/{name}"]) == pytest.approx(expected["per_answer_type"][name] / 100, abs=1e-6)


def test_vqa_score_refuses_bad_shapes():
    metric = VQAScore(["yes/no"])
    ids, scores = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^VQAScore.update: predicted \(2, 1\) must be \(B,\)"):
        metric.update(torch.zeros(2, 1, dtype=torch.long), ids, scores, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^VQAScore.update: answer_scores \(2, 2\) must be \(2, 3\)"):
        metric.update(torch.zeros(2, dtype=torch.long), ids, scores[:, :2], torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^VQAScore.update: type index 1 but 1 type names$"):
        metric.update(torch.zeros(2, dtype=torch.long), ids, scores, torch.ones(2, dtype=torch.long))
