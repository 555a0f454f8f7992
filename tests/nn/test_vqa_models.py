"""VQA models: question encoder, grid boxes, padding objects against oracles (the task's
loss and PCA: tests/tasks/vqa/test_vqa_task.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

from polyfuse.functional.counting import grid_boxes
from polyfuse.nn.models.vqa import BanVQA, FusionVQA
from polyfuse.nn.text import QuestionEncoder


def test_grid_boxes_hand_values():
    with warnings.catch_warnings():  # the meshgrid indexing is given: torch does not warn
        warnings.simplefilter("error")
        boxes = grid_boxes(2, 3)
    assert boxes.shape == (6, 4)
    torch.testing.assert_close(boxes[0], torch.tensor([0.0, 0.0, 1 / 3, 0.5]))
    torch.testing.assert_close(boxes[5], torch.tensor([2 / 3, 0.5, 1.0, 1.0]))  # row-major


def test_question_encoder_padding_and_word_vectors():
    vectors = torch.arange(12, dtype=torch.float32).view(4, 3)
    encoder = QuestionEncoder(4, embedding_dim=3, hidden_dim=5, word_vectors=vectors)
    torch.testing.assert_close(encoder.embedding.weight[:4], vectors)
    assert encoder.embedding.weight[4].abs().sum() == 0  # padding row
    tokens = torch.tensor([[0, 3, 4, 4]])
    output = encoder(tokens)
    # oracle: the GRU run step by step by nn.GRUCell with the same weights
    cell = torch.nn.GRUCell(3, 5)
    cell.weight_ih.data, cell.weight_hh.data = encoder.gru.weight_ih_l0.data, encoder.gru.weight_hh_l0.data
    cell.bias_ih.data, cell.bias_hh.data = encoder.gru.bias_ih_l0.data, encoder.gru.bias_hh_l0.data
    state = torch.zeros(1, 5)
    for step in range(4):
        state = cell(encoder.embedding.weight[tokens[:, step]], state)
        torch.testing.assert_close(output[:, step], state)
    with pytest.raises(ValueError, match=r"word indices must lie in \[0, 4\]"):
        encoder(torch.tensor([[5]]))
    with pytest.raises(ValueError, match="word_vectors has shape"):
        QuestionEncoder(4, embedding_dim=2, word_vectors=vectors)


@pytest.mark.parametrize("model_kind", ["ban", "concat"])
def test_zero_rows_of_the_image_are_padding(model_kind):
    torch.manual_seed(0)
    if model_kind == "ban":
        model = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=None).eval()
    else:
        model = FusionVQA("concat", 6, 4, 5, hidden_dim=8).eval()
    tokens = torch.tensor([[1, 2, 3, 6]])
    image = torch.randn(1, 4, 5)
    padded = torch.cat([image, torch.zeros(1, 3, 5)], dim=1)
    with torch.no_grad():
        logits, _ = model(tokens, image, None)
        padded_logits, attention = model(tokens, padded, None)
    torch.testing.assert_close(padded_logits, logits)
    if attention is not None:
        assert attention[:, :, 4:].abs().sum() == 0


def test_ban_vqa_needs_boxes_for_its_counter():
    model = BanVQA(3, 2, 4, hidden_dim=4, glimpses=1, counter_objects=2)
    with pytest.raises(ValueError, match="counter needs boxes"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match=r"image must have shape \(B, O, 4\)"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.randn(1, 3, 5), torch.zeros(1, 3, 4))


def test_question_encoder_accepts_sizes_of_one():
    encoder = QuestionEncoder(1, embedding_dim=1, hidden_dim=1)  # every size a positive integer
    assert encoder.num_words == 1 and encoder.hidden_dim == 1
    assert encoder(torch.tensor([[0, 1]])).shape == (1, 2, 1)


def test_question_encoder_checks_and_sizes():
    encoder = QuestionEncoder(4, embedding_dim=3, hidden_dim=5)
    assert encoder.hidden_dim == 5 and encoder.num_words == 4
    assert encoder.embedding.weight.shape == (5, 3) and encoder.embedding.padding_idx == 4
    assert encoder.embedding.weight[4].abs().sum() == 0
    assert encoder(torch.tensor([[0, 4], [3, 4]])).shape == (2, 2, 5)  # 0 .. V, V the padding
    message = r"^QuestionEncoder: word indices must lie in \[0, 4\]$"
    for bad in ([[-1, 0]], [[0, 5]]):
        with pytest.raises(ValueError, match=message):
            encoder(torch.tensor(bad))
    with pytest.raises(ValueError, match=r"^QuestionEncoder: tokens must be a \(B, L\) long tensor, got \(2,\) torch.int64$"):
        encoder(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^QuestionEncoder: tokens must be a \(B, L\) long tensor, got \(1, 2\) torch.int32$"):
        encoder(torch.tensor([[0, 1]], dtype=torch.int32))
    for name, value in [("num_words", 0), ("num_words", True), ("embedding_dim", 0), ("hidden_dim", 2.0)]:
        options = {"embedding_dim": 3, "hidden_dim": 5, name: value}
        num_words = options.pop("num_words", 4)
        with pytest.raises(ValueError, match=f"^QuestionEncoder: {name} must be a positive integer, got {value!r}$"):
            QuestionEncoder(num_words, **options)
    with pytest.raises(ValueError, match=r"^QuestionEncoder: word_vectors has shape \(4, 3\), expected \(4, 2\)$"):
        QuestionEncoder(4, embedding_dim=2, word_vectors=torch.zeros(4, 3))
    defaults = QuestionEncoder(2)
    assert defaults.embedding.embedding_dim == 300 and defaults.hidden_dim == 1024  # BAN section 5.4
    assert defaults.gru.num_layers == 1 and defaults.gru.batch_first


def test_image_mask_and_classifier_by_hand():
    from polyfuse.nn.models.vqa import answer_classifier, image_mask

    image = torch.tensor([[[0.0, 0.0], [1.0, -1.0], [0.0, 2.0]]])
    assert image_mask(image).tolist() == [[False, True, True]]  # |1| + |-1| is not 0
    torch.manual_seed(0)
    classifier = answer_classifier(3, 2, dropout=0.25)
    first, last = classifier[0], classifier[3]
    assert first.weight.shape == (6, 3) and last.weight.shape == (2, 6)
    assert first.parametrizations.weight.original0.shape == ()  # one gain for the whole matrix
    x = torch.randn(4, 3)
    expected = torch.relu(x @ first.weight.T + first.bias) @ last.weight.T + last.bias
    torch.testing.assert_close(classifier.eval()(x), expected)
    classifier.train()
    torch.manual_seed(1)
    trained = classifier(x)
    torch.manual_seed(1)
    keep = torch.nn.functional.dropout(torch.ones(4, 6), 0.25, True)  # the same draw
    expected = (torch.relu(x @ first.weight.T + first.bias) * keep) @ last.weight.T + last.bias
    torch.testing.assert_close(trained, expected)
    assert answer_classifier(3, 2)[2].p == 0.5  # the reference's classifier dropout


def test_vqa_model_defaults_are_the_papers():
    """BAN section 5.4 and ban-vqa: H 1024, 8 glimpses, 10 boxes counted, 300-d words, dropout
    0.2 / 0.5 / 0.5 (read from the signatures: building the full-size model is slow)."""
    import inspect

    ban = inspect.signature(BanVQA).parameters
    assert {name: ban[name].default for name in ("hidden_dim", "glimpses", "counter_objects", "embedding_dim", "dropout", "attention_dropout", "classifier_dropout")} == {
        "hidden_dim": 1024, "glimpses": 8, "counter_objects": 10, "embedding_dim": 300, "dropout": 0.2, "attention_dropout": 0.5, "classifier_dropout": 0.5
    }
    fusion = inspect.signature(FusionVQA).parameters
    assert (fusion["hidden_dim"].default, fusion["embedding_dim"].default, fusion["classifier_dropout"].default) == (1024, 300, 0.5)
    model = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=3, embedding_dim=7, dropout=0.1, attention_dropout=0.3, classifier_dropout=0.4)
    assert (model.ban.attention_rank, model.ban.joint_pool, model.ban.hidden_dim, model.glimpses) == (24, 1, 8, 2)
    assert (model.ban.dropout, model.ban.attention_dropout, model.classifier[2].p) == (0.1, 0.3, 0.4)
    assert model.question.embedding.embedding_dim == 7 and model.question.hidden_dim == 8
    assert model.counter.objects == 3 and model.attention_bias.shape == (2,)
    # BAN's attention rank and joint pooling pass through (model.options.ban of a VQA config)
    ranked = BanVQA(6, 4, 5, hidden_dim=8, glimpses=1, counter_objects=None, k=2, joint_pool=2)
    assert (ranked.ban.attention_rank, ranked.ban.joint_pool) == (16, 2)
    assert BanVQA(6, 4, 5, hidden_dim=8, glimpses=1, counter_objects=None, attention_rank=5).ban.attention_rank == 5
    assert [tuple(p.weight.shape) for p in model.count_projections] == [(8, 4), (8, 4)]
    assert model.classifier[3].weight.shape == (4, 16)


@pytest.mark.parametrize("owner", ["BanVQA", "FusionVQA"])
def test_vqa_batch_checks_name_the_model(owner):
    model = BanVQA(6, 4, 5, hidden_dim=8, glimpses=1) if owner == "BanVQA" else FusionVQA("concat", 6, 4, 5, hidden_dim=8)
    tokens, image, boxes = torch.zeros(2, 3, dtype=torch.long), torch.randn(2, 4, 5), torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match=f"^{owner}: " + r"image must have shape \(B, O, 5\), got \(4, 5\)$"):
        model(tokens, image[0], boxes)
    with pytest.raises(ValueError, match=f"^{owner}: " + r"tokens must have shape \(B, L\) with B = 2, got \(1, 3\)$"):
        model(tokens[:1], image, boxes)
    with pytest.raises(ValueError, match=f"^{owner}: " + r"tokens must have shape \(B, L\) with B = 2, got \(2, 3, 1\)$"):
        model(tokens[..., None], image, boxes)
    with pytest.raises(ValueError, match=f"^{owner}: " + r"boxes must have shape \(B, O, 4\) = \(2, 4, 4\), got \(2, 3, 4\)$"):
        model(tokens, image, boxes[:, :3])
    if owner == "BanVQA":
        with pytest.raises(ValueError, match=r"^BanVQA: the counter needs boxes \(B, O, 4\); use grid_boxes for grid features$"):
            model(tokens, image)


def test_fusion_vqa_is_the_fusion_between_encoder_and_classifier():
    torch.manual_seed(0)
    model = FusionVQA("ban", 6, 4, 5, hidden_dim=8, fusion_options={"glimpses": 2}).eval()
    assert model.fusion.glimpses == 2 and model.fusion.input_dims == [5, 8] and model.fusion.out_dim == 8
    tokens, image = torch.tensor([[1, 2, 6]]), torch.randn(1, 4, 5)
    image[0, 3] = 0.0  # a padding object
    logits, nothing = model(tokens, image)
    question = model.question(tokens)
    mask = torch.tensor([[True, True, True, False]])
    expected = model.classifier(model.fusion([image[:, :3], question], masks=[mask[:, :3], None]))
    torch.testing.assert_close(logits, expected)
    assert nothing is None and logits.shape == (1, 4)


def test_ban_vqa_dropout_only_in_training():
    torch.manual_seed(0)
    model = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=2)
    tokens, image, boxes = torch.tensor([[1, 2, 6]]), torch.randn(1, 4, 5), torch.rand(1, 4, 4)
    evaluated, _ = model.eval()(tokens, image, boxes)
    trained, _ = model.train()(tokens, image, boxes)
    assert not torch.allclose(trained, evaluated)
    only_fusion = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=2, attention_dropout=0.0, classifier_dropout=0.0)
    only_fusion.load_state_dict(model.state_dict())
    assert not torch.allclose(only_fusion.train()(tokens, image, boxes)[0], evaluated)  # the 0.2 before each map
    none = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=2, dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0)
    none.load_state_dict(model.state_dict())
    torch.testing.assert_close(none.train()(tokens, image, boxes)[0], evaluated)


def test_vqa_models_built_with_their_defaults_have_the_papers_sizes():
    # The defaults as built (a signature alone would not show a changed default).
    model = BanVQA(6, 4, 5)
    assert (model.question.hidden_dim, model.question.embedding.embedding_dim, model.glimpses) == (1024, 300, 8)
    assert (model.ban.hidden_dim, model.ban.attention_rank, model.ban.joint_pool) == (1024, 3 * 1024, 1)
    assert model.counter.objects == 10
    fusion = FusionVQA("concat", 6, 4, 5)
    assert (fusion.question.hidden_dim, fusion.question.embedding.embedding_dim) == (1024, 300)


@pytest.mark.parametrize("kind", ["ban", "fusion"])
def test_vqa_models_start_from_the_given_word_vectors(kind):
    vectors = torch.randn(6, 3)
    options = {"hidden_dim": 8, "embedding_dim": 3, "word_vectors": vectors}
    if kind == "ban":
        model = BanVQA(6, 4, 5, glimpses=1, counter_objects=None, **options)
    else:
        model = FusionVQA("concat", 6, 4, 5, **options)
    torch.testing.assert_close(model.question.embedding.weight[:6].detach(), vectors)


def test_ban_vqa_dropout_rates_reach_the_image_and_the_attention():
    # dropout 0.2 on the inputs (not 1.0: the image must still matter in training), and
    # the attention dropout in training (two draws give two maps); classifier without.
    torch.manual_seed(0)
    model = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=None, classifier_dropout=0.0).train()
    tokens = torch.tensor([[1, 2, 6]])
    first, second = torch.randn(1, 4, 5), torch.randn(1, 4, 5)
    torch.manual_seed(1)
    one, _ = model(tokens, first)
    torch.manual_seed(1)
    other, _ = model(tokens, second)
    assert not torch.allclose(one, other)
    only_attention = BanVQA(6, 4, 5, hidden_dim=8, glimpses=2, counter_objects=None, dropout=0.0, classifier_dropout=0.0)
    only_attention.load_state_dict(model.state_dict())
    only_attention.train()
    torch.manual_seed(1)
    _, attention_one = only_attention(tokens, first)
    torch.manual_seed(2)
    _, attention_two = only_attention(tokens, first)
    assert not torch.allclose(attention_one, attention_two)


def test_fusion_vqa_classifier_dropout_is_the_given_rate():
    assert FusionVQA("concat", 6, 4, 5, hidden_dim=8, classifier_dropout=0.0).classifier[2].p == 0.0


def test_question_encoder_second_embedding_is_concatenated():
    """ban-vqa's op 'c': the GRU reads cat(emb(x), emb_(x)); both tables have V + 1 rows
    with padding index V. Oracle: nn.GRUCell stepped over the concatenated rows."""
    vectors = torch.arange(12, dtype=torch.float32).view(4, 3)
    encoder = QuestionEncoder(4, embedding_dim=3, hidden_dim=5, word_vectors=vectors, second_embedding_dim=3)
    second = encoder.second_embedding
    assert second.weight.shape == (5, 3) and second.padding_idx == 4 and encoder.gru.input_size == 6
    torch.testing.assert_close(second.weight[:4], vectors)  # ban-vqa copies GloVe into both
    assert second.weight[4].abs().sum() == 0
    with torch.no_grad():
        second.weight[:4] = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[2, 0, 4]])
    output = encoder(tokens)
    cell = torch.nn.GRUCell(6, 5)
    cell.weight_ih.data, cell.weight_hh.data = encoder.gru.weight_ih_l0.data, encoder.gru.weight_hh_l0.data
    cell.bias_ih.data, cell.bias_hh.data = encoder.gru.bias_ih_l0.data, encoder.gru.bias_hh_l0.data
    state = torch.zeros(1, 5)
    for step in range(3):
        word = tokens[:, step]
        state = cell(torch.cat([encoder.embedding.weight[word], second.weight[word]], dim=1), state)
        torch.testing.assert_close(output[:, step], state)
    # another size: no GloVe rows copied (they would not fit), GRU of E + E2 inputs
    other = QuestionEncoder(4, embedding_dim=3, hidden_dim=5, word_vectors=vectors, second_embedding_dim=2)
    assert other.gru.input_size == 5 and not torch.equal(other.second_embedding.weight[:4, :2], vectors[:, :2])
    with pytest.raises(ValueError, match=r"^QuestionEncoder: second_embedding_dim must be a positive integer, got 0$"):
        QuestionEncoder(4, embedding_dim=3, second_embedding_dim=0)


def test_question_encoder_without_second_embedding_keeps_its_state_dict():
    encoder = QuestionEncoder(4, embedding_dim=3, hidden_dim=5)
    assert encoder.second_embedding is None
    assert sorted(encoder.state_dict()) == [
        "embedding.weight", "gru.bias_hh_l0", "gru.bias_ih_l0", "gru.weight_hh_l0", "gru.weight_ih_l0",
    ]  # fmt: skip
    model = BanVQA(4, 3, 6, hidden_dim=8, glimpses=2, embedding_dim=3, second_embedding_dim=3)
    assert model.state_dict()["question.second_embedding.weight"].shape == (5, 3)
    assert "question.second_embedding.weight" not in BanVQA(4, 3, 6, hidden_dim=8, glimpses=2, embedding_dim=3).state_dict()
