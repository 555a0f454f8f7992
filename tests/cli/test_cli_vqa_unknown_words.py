"""``polyfuse predict`` on new VQA questions names, in one warning per run, the words the
checkpoint's vocabulary lacks (read as ``<unk>``) (issue 41)."""

from __future__ import annotations

import json
import warnings
from collections import Counter

from polyfuse.cli.main import main
from polyfuse.data.formats.vqa import UNKNOWN_WORD, VQAQuestion
from polyfuse.tasks.vqa.new_questions import unknown_words, warn_unknown_words

WORDS = ["what", "color", "is", "the", "shape", "red", UNKNOWN_WORD]


def _question(text: str) -> VQAQuestion:
    return VQAQuestion(0, 0, text, (), "", "")


def test_unknown_words_are_counted_among_the_words_the_model_reads():
    questions = [_question("What colour is the object?"), _question("is the colour red, or present?"),
                 _question("is the shape red red red red colour")]  # fmt: skip
    assert unknown_words(questions, WORDS, max_length=14) == Counter(colour=3, object=1, present=1, **{"or": 1})
    # words past max_length are never read, so never reported
    assert unknown_words(questions[2:], WORDS, max_length=6) == Counter()
    assert unknown_words([_question("what color is the shape?")], WORDS, max_length=14) == Counter()


def test_one_warning_lists_the_words_most_frequent_first_and_counts_the_rest():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_unknown_words(Counter(present=1, colour=2, object=1), WORDS)
        warn_unknown_words(Counter(), WORDS)  # nothing unknown: nothing said
        warn_unknown_words(Counter({f"w{i:02d}": 1 for i in range(25)}), WORDS, named=20)
        warn_unknown_words(Counter(colour=1), WORDS[:-1])  # a vocabulary from before <unk>
    assert [str(w.message) for w in caught] == [
        "VQA: 3 word(s) of the questions are not in the checkpoint's vocabulary and read as <unk>: "
        "colour x2, object, present",
        "VQA: 25 word(s) of the questions are not in the checkpoint's vocabulary and read as <unk>: "
        + ", ".join(f"w{i:02d}" for i in range(20)) + " and 5 more",
        "VQA: 1 word(s) of the questions are not in the checkpoint's vocabulary and read as padding "
        "(the checkpoint predates <unk>): colour",
    ]


def test_predict_warns_once_naming_the_unknown_words_of_new_questions(trained_vqa, tmp_path, capsys):
    asked = tmp_path / "questions.json"
    questions = [
        {"question_id": 1, "image_id": 16, "question": "what colour is the object?"},
        {"question_id": 2, "image_id": 17, "question": "is the colour present?"},
        {"question_id": 3, "image_id": 18, "question": "what color is the shape?"},
    ]
    asked.write_text(json.dumps({"questions": questions}))
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images",
                 str(trained_vqa.folder / "test.h5"), "--out", str(tmp_path / "answers.csv")]) == 0  # fmt: skip
    said = [line for line in capsys.readouterr().err.splitlines() if "vocabulary" in line]
    assert said == ["polyfuse predict: warning: VQA: 3 word(s) of the questions are not in the checkpoint's "
                    "vocabulary and read as <unk>: colour x2, object, present"]
    # questions of known words only: nothing said
    asked.write_text(json.dumps({"questions": questions[2:]}))
    assert main(["predict", "--checkpoint", str(trained_vqa.best), "--data", str(asked), "--images",
                 str(trained_vqa.folder / "test.h5"), "--out", str(tmp_path / "answers.csv")]) == 0  # fmt: skip
    assert "vocabulary" not in capsys.readouterr().err
