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
    soft_score_of,
    soft_targets,
    word_vocabulary,
)
from polyfuse.text import tokenize_question


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
    assert tokenize_question("Is it the dog's ball?") == ["is", "it", "the", "dog", "'s", "ball"]
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
    # unknown words take <unk>'s index (V - 1 = 1), the padding V = 2; a vocabulary without <unk> is refused
    unknown = encode_questions(questions, ["how", UNKNOWN_WORD], max_length=7)
    assert unknown[0].tolist() == [0, 1, 1, 1, 1, 2, 2]  # "how many dogs are there": 5 words, then padding
    with pytest.raises(ValueError, match="the word vocabulary has no <unk> entry"):
        encode_questions(questions, ["how"], max_length=7)


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
    with pytest.raises(ValueError, match="question_id 7 has neither answers nor a multiple_choice_answer"):
        question_answer(VQAQuestion(7, 0, "?", (), "other", ""))


def test_soft_scores_by_hand():
    # one question: "cat" 1 human, "dog" 2, "cow" 3, "pig" 4; "owl" said by none
    question = VQAQuestion(0, 0, "?", ("cat", "dog", "dog", "cow", "cow", "cow", "pig", "pig", "pig", "pig"), "other", "")
    answers = ["cat", "dog", "cow", "pig", "owl"]
    ban = soft_targets([question], answers)  # the default: ban-vqa's get_score
    torch.testing.assert_close(ban, torch.tensor([[0.3, 0.6, 0.9, 1.0, 0.0]]))
    third = soft_targets([question], answers, soft_score="min_third")
    torch.testing.assert_close(third, torch.tensor([[1 / 3, 2 / 3, 1.0, 1.0, 0.0]]))
    # ban-vqa's steps are the accuracy min(n / 3, 1) averaged over the ten sets of nine humans
    for n in range(11):
        left_out = [min((n - (i < n)) / 3, 1.0) for i in range(10)]
        assert soft_score_of(n) == pytest.approx(sum(left_out) / 10, abs=1e-12)
    with pytest.raises(ValueError, match="soft score 'linear' is not one of ban_vqa, min_third"):
        soft_targets([], ["cat"], soft_score="linear")


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
    with pytest.raises(ValueError, match=r"line 1: word .dog. has 3 values, expected 4"):
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


def _adaptive_file(path, *, pos_boxes, rows=6, spatial_rows=None, box_name="spatial_features"):
    """ban-vqa's adaptive layout: ``rows`` stacked boxes of 4-d features, their normalised
    spatial features, pixel boxes and ``pos_boxes``."""
    features = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 1
    spatial = np.stack([np.array([0.1, 0.2, 0.3, 0.4, 0.2, 0.2]) + r for r in range(spatial_rows or rows)]).astype(np.float32)
    with h5py.File(path, "w") as handle:
        handle["image_features"] = features
        handle[box_name] = spatial
        handle["image_bb"] = np.full((rows, 4), 640.0, dtype=np.float32)
        handle["pos_boxes"] = np.array(pos_boxes, dtype=np.int32)
    return features, spatial


def test_adaptive_bottom_up_layout_is_padded_per_image(tmp_path):
    # images 100, 200, 300 with 2, 3 and 1 boxes; pos_boxes row 3 was never written
    # (an image the converter did not find), as ban-vqa leaves it: [0, 0]
    h5 = tmp_path / "train.hdf5"
    features, spatial = _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5], [5, 6], [0, 0]])
    index = tmp_path / "ids.json"
    index.write_text(json.dumps({"100": 0, "200": 1, "300": 2}))
    regions = load_bottom_up_features(h5, index)
    assert regions.features.shape == (4, 3, 4) and regions.boxes.shape == (4, 3, 4)
    expected = np.zeros((4, 3, 4), dtype=np.float32)
    expected[0, :2], expected[1, :3], expected[2, :1] = features[0:2], features[2:5], features[5:6]
    np.testing.assert_array_equal(regions.features.numpy(), expected)
    # boxes: the first four columns of spatial_features (ban-vqa's name), not image_bb
    np.testing.assert_array_equal(regions.boxes[1, :3].numpy(), spatial[2:5, :4])
    assert regions.boxes[0, 2].abs().sum() == 0 and regions.boxes[2, 1:].abs().sum() == 0
    selected, selected_boxes = regions.select([300, 100])
    np.testing.assert_array_equal(selected[0, 0].numpy(), features[5])
    np.testing.assert_array_equal(selected_boxes[1, 1].numpy(), spatial[1, :4])
    # the name read before ban-vqa's, and the fixed layout under ban-vqa's name
    _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5], [5, 6]], box_name="spatials")
    np.testing.assert_array_equal(load_bottom_up_features(h5, index).boxes[2, 0].numpy(), spatial[5, :4])
    with h5py.File(tmp_path / "val36.hdf5", "w") as handle:
        handle["image_features"] = np.ones((3, 2, 4), dtype=np.float32)
        handle["spatial_features"] = np.full((3, 2, 6), 0.5, dtype=np.float32)
    assert load_bottom_up_features(tmp_path / "val36.hdf5", index).boxes.shape == (3, 2, 4)


def test_padded_boxes_do_not_change_the_answer(tmp_path):
    from polyfuse.nn.models.vqa import BanVQA, FusionVQA

    h5, index = tmp_path / "train.hdf5", tmp_path / "ids.json"
    _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5], [5, 6]])
    index.write_text(json.dumps({"100": 0, "200": 1, "300": 2}))
    regions = load_bottom_up_features(h5, index)
    tokens = torch.tensor([[0, 1, 2]])
    torch.manual_seed(0)
    models = [
        BanVQA(3, 5, 4, hidden_dim=8, glimpses=2, counter_objects=None, embedding_dim=6),
        BanVQA(3, 5, 4, hidden_dim=8, glimpses=2, counter_objects=1, embedding_dim=6),  # the counter too
        FusionVQA("concat", 3, 5, 4, hidden_dim=8, embedding_dim=6),
    ]
    for model in models:
        model.eval()
        for row, boxes in ((0, 2), (2, 1)):  # padded to 3 boxes vs the image's own boxes alone
            padded, _ = model(tokens, regions.features[row : row + 1], regions.boxes[row : row + 1])
            alone, _ = model(tokens, regions.features[row : row + 1, :boxes], regions.boxes[row : row + 1, :boxes])
            torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("pos_boxes", "message"),
    [
        ([[0, 2], [2, 7], [5, 6]], r"pos_boxes row 1 \(image id 200\) is \[2, 7\); expected 0 <= start < end <= 6"),
        ([[0, 2], [2, 2], [2, 6]], r"pos_boxes row 1 \(image id 200\) is \[2, 2\); expected 0 <= start < end"),
        ([[0, 3], [2, 5], [5, 6]], r"row 1 \(image id 200\) is \[2, 5\), which overlaps or precedes row 0 ending at 3"),
        ([[2, 5], [0, 2], [5, 6]], r"row 1 \(image id 200\) is \[0, 2\), which overlaps or precedes row 0 ending at 5"),
        ([[0, 2, 9], [2, 5, 9], [5, 6, 9]], r"pos_boxes must be an \(images, 2\) integer array"),
        ([[0, 2], [2, 5]], r"rows of image ids \[300\] lie outside \[0, 2\), the rows of pos_boxes"),
    ],
)
def test_bad_adaptive_layouts_are_named(tmp_path, pos_boxes, message):
    h5, index = tmp_path / "train.hdf5", tmp_path / "ids.json"
    _adaptive_file(h5, pos_boxes=pos_boxes)
    index.write_text(json.dumps({"100": 0, "200": 1, "300": 2}))
    with pytest.raises(ValueError, match=message):
        load_bottom_up_features(h5, index)


def test_adaptive_lengths_and_values_are_checked(tmp_path):
    h5, index = tmp_path / "train.hdf5", tmp_path / "ids.json"
    index.write_text(json.dumps({"100": 0, "200": 1}))
    _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5]], spatial_rows=5)
    with pytest.raises(ValueError, match=r"image_features \(6, 4\) and spatial_features \(5, 6\) do not match the "
                                         r"adaptive layout: expected \(R, d\) and \(R, 4 or 6\), R boxes"):
        load_bottom_up_features(h5, index)
    _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5]])
    with h5py.File(h5, "a") as handle:
        handle["image_features"][3, 1] = np.nan
    with pytest.raises(ValueError, match=r"train.hdf5: dataset 'image_features' holds NaN or Inf at 1 image\(s\), "
                                         r"the first image id 200 \(row 1\)"):
        load_bottom_up_features(h5, index)


def test_adaptive_batches_are_padded_to_their_own_most_boxes(tmp_path):
    from polyfuse.data.formats.features import RegionFeatures

    h5, index = tmp_path / "train.hdf5", tmp_path / "ids.json"
    features, spatial = _adaptive_file(h5, pos_boxes=[[0, 2], [2, 5], [5, 6]])
    index.write_text(json.dumps({"100": 0, "200": 1, "300": 2}))
    regions = RegionFeatures(h5, index)
    assert (regions.images, regions.max_boxes, regions.dim) == (3, 3, 4)
    image, boxes = regions.read([2, 0, 2])  # 1, 2 and 1 boxes: padded to 2, not the file's 3
    expected = np.zeros((3, 2, 4), dtype=np.float32)
    expected[0, :1], expected[1, :2], expected[2, :1] = features[5:6], features[0:2], features[5:6]
    np.testing.assert_array_equal(image.numpy(), expected)
    np.testing.assert_array_equal(boxes[1].numpy(), spatial[0:2, :4])
    whole = load_bottom_up_features(h5, index)  # in memory: the same values, padded to 3
    np.testing.assert_array_equal(whole.features[[2, 0, 2], :2].numpy(), expected)
    assert regions.read([2], pad_to=3)[0].shape == (1, 3, 4)


def test_a_features_file_without_images_is_refused(tmp_path):
    with h5py.File(tmp_path / "empty.h5", "w") as handle:
        handle["features"] = np.zeros((0, 4, 5), dtype=np.float16)
        handle["boxes"] = np.zeros((0, 4, 4), dtype=np.float32)
        handle["image_ids"] = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match=r"empty\.h5: holds no images"):
        load_image_features(tmp_path / "empty.h5")


def test_fixed_layout_shapes_and_kinds_of_file(tmp_path):
    from polyfuse.data.formats.features import RegionFeatures, is_bottom_up

    index = tmp_path / "ids.json"
    index.write_text(json.dumps({"7": 0, "8": 1}))
    path = tmp_path / "val36.hdf5"
    with h5py.File(path, "w") as handle:
        handle["image_features"] = np.ones((2, 5, 3), dtype=np.float32)
        handle["spatial_features"] = np.full((2, 5, 6), 0.5, dtype=np.float32)
    regions = RegionFeatures(path, index)
    assert (regions.images, regions.max_boxes, regions.dim, regions.box_name) == (2, 5, 3, "spatial_features")
    assert is_bottom_up(path) and not is_bottom_up(_polyfuse_file(tmp_path / "p.h5"))
    for boxes, shape in (((2, 4, 6), r"\(2, 4, 6\)"), ((2, 5, 3), r"\(2, 5, 3\)"), ((3, 5), r"\(3, 5\)")):
        with h5py.File(path, "w") as handle:
            handle["image_features"] = np.ones((2, 5, 3), dtype=np.float32)
            handle["spatial_features"] = np.zeros(boxes, dtype=np.float32)
        with pytest.raises(ValueError, match=rf"image_features \(2, 5, 3\) and spatial_features {shape} do not match the "
                                             r"fixed layout: expected \(N, O, d\) and \(N, O, 4 or 6\)"):
            RegionFeatures(path, index)


def _polyfuse_file(path):
    with h5py.File(path, "w") as handle:
        handle["features"] = np.ones((1, 2, 3), dtype=np.float16)
        handle["boxes"] = np.zeros((1, 2, 4), dtype=np.float32)
        handle["image_ids"] = np.array([4])
    return path
