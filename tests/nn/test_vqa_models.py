"""VQA models: question encoder, grid boxes, padding objects, loss and PCA against oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polyfuse.data.vqa_data import fit_pca, project_features
from polyfuse.functional.counting import grid_boxes
from polyfuse.nn.text import QuestionEncoder
from polyfuse.nn.vqa import BanVQA, FusionVQA
from polyfuse.tasks.vqa import vqa_loss


def test_grid_boxes_hand_values():
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


def test_vqa_loss_is_bce_summed_over_answers():
    logits = torch.tensor([[0.0, 2.0], [-1.0, 1.0]])
    targets = torch.tensor([[1.0, 1 / 3], [0.0, 1.0]])
    expected = 0.0
    for row in range(2):
        for column in range(2):
            p = 1 / (1 + np.exp(-logits[row, column].item()))
            t = targets[row, column].item()
            expected -= t * np.log(p) + (1 - t) * np.log(1 - p)
    assert vqa_loss(logits, targets).item() == pytest.approx(expected / 2, rel=1e-6)
    assert F.binary_cross_entropy_with_logits(logits, targets).item() != pytest.approx(expected / 2)


def test_pca_matches_covariance_eigenvectors():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(50, 3, 6, generator=generator, dtype=torch.float64) * torch.tensor(
        [5.0, 3.0, 1.0, 0.5, 0.2, 0.1], dtype=torch.float64
    )
    features[0, 2] = 0.0  # a padding row: left out of the fit, stays zero
    mean, directions = fit_pca(features, 2)
    rows = features.reshape(-1, 6).numpy()
    rows = rows[np.abs(rows).sum(axis=1) != 0]
    values, vectors = np.linalg.eigh(np.cov(rows, rowvar=False))
    top = vectors[:, ::-1][:, :2]
    np.testing.assert_allclose(np.abs(top.T @ directions.numpy()), np.eye(2), atol=1e-8)
    projected = project_features(features, mean, directions)
    assert projected[0, 2].abs().sum() == 0
    real = projected.reshape(-1, 2)[torch.from_numpy(np.abs(features.reshape(-1, 6).numpy()).sum(1) != 0)]
    np.testing.assert_allclose(real.var(dim=0).numpy(), values[::-1][:2], rtol=1e-8)


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
