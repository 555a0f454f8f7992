"""VQA 2.0 / easy-VQA / GloVe / feature-file importers, checked against hand-written files."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from polyfuse.data.formats.features import load_bottom_up_features, load_image_features
from polyfuse.data.formats.glove import load_glove
from polyfuse.data.formats.vqa import (
    UNKNOWN_WORD,
    VQAQuestion,
    answer_vocabulary,
    encode_questions,
    load_vqa,
    question_answer,
    soft_targets,
    tokenize,
    word_vocabulary,
)


def _write_vqa(tmp_path, answers_of_first=None):
    questions = {
        "questions": [
            {"question_id": 1, "image_id": 10, "question": "How many dogs are there?"},
            {"question_id": 2, "image_id": 11, "question": "Is it the dog's ball?"},
        ]
    }
    first = answers_of_first or ["two"] * 4 + ["2"] * 2 + ["3"] * 4
    annotations = {
        "annotations": [
            {"question_id": 1, "image_id": 10, "answer_type": "number", "question_type": "how many",
             "answers": [{"answer": a, "answer_id": i} for i, a in enumerate(first)]},
            {"question_id": 2, "image_id": 11, "answer_type": "yes/no", "question_type": "is it",
             "answers": [{"answer": "yes", "answer_id": i} for i in range(10)]},
        ]
    }  # fmt: skip
    (tmp_path / "q.json").write_text(json.dumps(questions))
    (tmp_path / "a.json").write_text(json.dumps(annotations))
    return tmp_path / "q.json", tmp_path / "a.json"


def test_load_vocabularies_and_targets(tmp_path):
    questions = load_vqa(*_write_vqa(tmp_path))
    assert [q.question_id for q in questions] == [1, 2]
    assert questions[0].answer_type == "number" and len(questions[0].answers) == 10
    assert tokenize("Is it the dog's ball?") == ["is", "it", "the", "dog", "'s", "ball"]
    # normalised answers: "two" -> "2" (6 times), "3" (4 times), "yes" (10 times)
    assert answer_vocabulary(questions, min_count=5, count="all_answers") == ["yes", "2"]
    assert answer_vocabulary(questions, min_count=1, count="all_answers") == ["yes", "2", "3"]
    # per question: the most frequent normalised answer ("2", given 6 times; "yes")
    assert answer_vocabulary(questions, min_count=1) == ["2", "yes"]
    targets = soft_targets(questions, ["yes", "2", "3"])
    torch.testing.assert_close(targets, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    words = word_vocabulary(questions, min_count=1)
    assert words[-1] == UNKNOWN_WORD
    tokens = encode_questions(questions, words, max_length=4)
    assert tokens.shape == (2, 4)
    assert tokens[0].tolist() == [words.index("how"), words.index("many"), words.index("dogs"), words.index("are")]
    # a vocabulary without <unk> (a checkpoint written before it): unknown words are padding
    unknown = encode_questions(questions, ["how"], max_length=7)
    assert unknown[0].tolist() == [0, 1, 1, 1, 1, 1, 1]  # unknown words and padding: index 1 = V


def test_unknown_words_share_a_trained_row_and_padding_stays_untrained(tmp_path):
    from polyfuse.nn.text import QuestionEncoder

    texts = ["what color is the circle?", "what color is the zebra?", "what shape is the circle?"]
    train = [VQAQuestion(i, i, text, ("red",) * 10, "other", "") for i, text in enumerate(texts)]
    words = word_vocabulary(train)  # "zebra" (once) and "shape" (once) fall below min_count 2
    # by hand: what 3, is 3, the 3, color 2, circle 2
    assert words == ["is", "the", "what", "circle", "color", UNKNOWN_WORD]
    unknown, padding = 5, 6
    test = [VQAQuestion(9, 9, "is the giraffe tall?", ("no",) * 10, "yes/no", "")]
    assert encode_questions(test, words, max_length=6)[0].tolist() == [0, 1, unknown, unknown, padding, padding]
    tokens = encode_questions(train, words, max_length=6)
    assert tokens[1].tolist() == [2, 4, 0, 1, unknown, padding]

    torch.manual_seed(0)
    encoder = QuestionEncoder(len(words), embedding_dim=4, hidden_dim=3)
    encoder(tokens).square().sum().backward()
    gradient = encoder.embedding.weight.grad
    assert gradient[unknown].abs().sum() > 0  # the rare training words train the <unk> row
    assert torch.equal(gradient[padding], torch.zeros(4))  # padding: no gradient, ever
    assert torch.equal(encoder.embedding.weight[padding], torch.zeros(4))


def _annotated(tmp_path, entries):
    """Files of questions ``(answers, multiple_choice_answer or None)``, one image each."""
    questions = [{"question_id": i, "image_id": i, "question": "what color?"} for i in range(len(entries))]
    annotations = []
    for i, (answers, choice) in enumerate(entries):
        entry = {"question_id": i, "image_id": i, "answers": [{"answer": a} for a in answers]}
        if choice is not None:
            entry["multiple_choice_answer"] = choice
        annotations.append(entry)
    (tmp_path / "q.json").write_text(json.dumps({"questions": questions}))
    (tmp_path / "a.json").write_text(json.dumps({"annotations": annotations}))
    return load_vqa(tmp_path / "q.json", tmp_path / "a.json")


def test_answer_vocabulary_counts_questions_by_their_multiple_choice_answer(tmp_path):
    # Three questions answered "blue" by 6 humans and "red" by 4: humans said "red" 12
    # times, but it is the multiple-choice answer of no question. One question with
    # "Red" as its (normalised) multiple-choice answer although most humans said green.
    questions = _annotated(
        tmp_path,
        [(["blue"] * 6 + ["red"] * 4, "blue")] * 3 + [(["green"] * 7 + ["red"] * 3, "Red")],
    )
    assert questions[3].multiple_choice_answer == "Red"
    # by hand: multiple choice blue 3, red 1; all answers red 15, blue 18, green 7
    assert answer_vocabulary(questions, min_count=3) == ["blue"]
    assert answer_vocabulary(questions, min_count=1) == ["blue", "red"]
    assert answer_vocabulary(questions, min_count=9, count="all_answers") == ["blue", "red"]
    assert answer_vocabulary(questions, min_count=1, count="all_answers") == ["blue", "red", "green"]
    with pytest.raises(ValueError, match="answer count 'questions' is not one of multiple_choice, all_answers"):
        answer_vocabulary(questions, count="questions")


def test_answer_without_multiple_choice_field_is_the_most_frequent(tmp_path):
    # No multiple_choice_answer in the file: the most frequent normalised human answer
    # ("Two" and "2" are one answer), a tie going to the answer given first.
    questions = _annotated(
        tmp_path,
        [(["3"] * 4 + ["Two"] * 3 + ["2"] * 3, None), (["cat"] * 5 + ["dog"] * 5, None), (["dog"] * 5 + ["cat"] * 5, None)],
    )
    assert [question_answer(q) for q in questions] == ["2", "cat", "dog"]
    assert questions[0].multiple_choice_answer is None
    assert answer_vocabulary(questions, min_count=1) == ["2", "cat", "dog"]


def test_bad_files_are_named(tmp_path):
    q, a = _write_vqa(tmp_path, answers_of_first=["2"] * 9)
    with pytest.raises(ValueError, match=r"a\.json: entry 0 \(question_id 1\) has 9 answers, expected 10"):
        load_vqa(q, a)
    q, a = _write_vqa(tmp_path)
    content = json.loads(q.read_text())
    del content["questions"][1]["image_id"]
    q.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"q\.json: entry 1 has no field 'image_id'"):
        load_vqa(q, a)
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        load_vqa(tmp_path / "missing.json", a)


def test_glove(tmp_path):
    path = tmp_path / "glove.txt"
    path.write_text("dog 1 2 3\ncat 4 5 6\nthe 7 8 9\n")
    table, found = load_glove(path, ["cat", "bird", "dog"], dim=3)
    assert found == 2
    torch.testing.assert_close(table, torch.tensor([[4.0, 5, 6], [0, 0, 0], [1, 2, 3]]))
    with pytest.raises(ValueError, match="line 1: 3 numbers, expected 4"):
        load_glove(path, ["dog"], dim=4)
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        load_glove(tmp_path / "nope.txt", ["dog"])


def test_feature_files(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as handle:
        handle["features"] = np.arange(2 * 3 * 4, dtype=np.float16).reshape(2, 3, 4)
        handle["boxes"] = np.zeros((2, 3, 4), dtype=np.float32)
        handle["image_ids"] = np.array([7, 5])
    features = load_image_features(path)
    selected, _ = features.select([5, 7, 5])
    assert selected[:, 0, 0].tolist() == [12.0, 0.0, 12.0]
    with pytest.raises(ValueError, match=r"no features for image id\(s\) \[6\]"):
        features.select([5, 6])

    bottom_up = tmp_path / "train36.hdf5"
    with h5py.File(bottom_up, "w") as handle:
        handle["image_features"] = np.ones((2, 3, 5), dtype=np.float32)
        handle["spatials"] = np.tile(np.array([0.1, 0.2, 0.5, 0.6, 0.4, 0.4], dtype=np.float32), (2, 3, 1))
    index = tmp_path / "ids.json"
    index.write_text(json.dumps({"42": 1, "43": 0}))
    regions = load_bottom_up_features(bottom_up, index)
    assert regions.rows == {42: 1, 43: 0}
    torch.testing.assert_close(regions.boxes[0, 0], torch.tensor([0.1, 0.2, 0.5, 0.6]))
    (tmp_path / "ids.csv").write_text("image_id,row\n42,1\n")
    assert load_bottom_up_features(bottom_up, tmp_path / "ids.csv").rows == {42: 1}
    pickled = tmp_path / "ids.pkl"
    pickled.write_bytes(b"not read")
    with pytest.raises(ValueError, match="never unpickled"):
        load_bottom_up_features(bottom_up, pickled)
    index.write_text(json.dumps({"42": 2}))
    with pytest.raises(ValueError, match=r"rows of image ids \[42\] lie outside"):
        load_bottom_up_features(bottom_up, index)


def test_easy_vqa_import(tmp_path):
    pytest.importorskip("easy_vqa")
    from polyfuse.data.formats.easy_vqa import import_easy_vqa

    paths = import_easy_vqa(tmp_path, limit=3)
    questions = load_vqa(paths["train"]["questions"], paths["train"]["annotations"])
    assert {q.image_id for q in questions} == {0, 1, 2}
    # the package's first training question (its data/train/questions.json)
    assert questions[0].question == "what is the blue shape?" and set(questions[0].answers) == {"rectangle"}
    assert questions[0].question_type == "shape" and questions[0].answer_type == "other"
    kinds = {q.question_type for q in questions}
    assert kinds <= {"yes/no", "shape", "color"}
    for q in questions:
        assert (q.question_type == "yes/no") == (q.answers[0] in ("yes", "no"))
