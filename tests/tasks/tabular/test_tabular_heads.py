"""The backbone (encoders, fusion, skip) and the tasks' heads and losses."""

import pytest
import torch

import polyfuse
from polyfuse.nn.backbones import FusionBackbone, ModalityEncoder
from polyfuse.tasks.tabular.spec import ClassificationTask, SentimentTask, TraitsTask

DIMS = (5, 3, 4)


def backbone(kind, fusion="man", skip=True, groups=None, dims=DIMS):
    torch.manual_seed(0)
    encoders = [ModalityEncoder(d, kind=kind, hidden_dim=6, dropout=0.0) for d in dims]
    fusion_dims = [e.output_dim for e in encoders] if groups is None else [sum(encoders[j].output_dim for j in g) for g in groups]
    module = polyfuse.nn.create(fusion, input_dims=fusion_dims, out_dim=7)
    return FusionBackbone(module, encoders, fusion_dim=7, out_dim=8, skip=skip, groups=groups).eval()


def window_batch(lengths=(4, 2, 3), steps=4, extra=0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    inputs, masks = [], []
    for d in DIMS:
        x = torch.randn(len(lengths), steps + extra, d, generator=generator)
        mask = torch.arange(steps + extra) < torch.tensor(lengths)[:, None]
        inputs.append(x * mask.unsqueeze(-1))
        masks.append(mask)
    return inputs, masks


@pytest.mark.parametrize("kind", ["none", "linear", "gru"])
@pytest.mark.parametrize("fusion", ["man", "concat", "tfn", "lmf"])
def test_backbone_ignores_padding(kind, fusion):
    model = backbone(kind, fusion)
    inputs, masks = window_batch()
    centre = torch.tensor([1, 0, 2])
    short = model(inputs, masks, centre)
    # The same samples with three more padded steps holding garbage.
    padded_inputs, padded_masks = [], []
    for x, m in zip(inputs, masks, strict=True):
        garbage = torch.full((x.shape[0], 3, x.shape[2]), 55.0)
        padded_inputs.append(torch.cat([x, garbage], dim=1))
        padded_masks.append(torch.cat([m, torch.zeros(x.shape[0], 3, dtype=torch.bool)], dim=1))
    assert short.shape == (3, 8)
    torch.testing.assert_close(model(padded_inputs, padded_masks, centre), short, rtol=1e-5, atol=1e-5)


def test_skip_uses_the_centre_step():
    model = backbone("linear", "concat")
    inputs, masks = window_batch(lengths=(4, 4, 4))
    first = model(inputs, masks, torch.tensor([0, 0, 0]))
    second = model(inputs, masks, torch.tensor([2, 0, 0]))
    assert not torch.allclose(first[0], second[0]) and torch.allclose(first[1:], second[1:])
    without = backbone("linear", "concat", skip=False)
    torch.testing.assert_close(without(inputs, masks, torch.tensor([0, 0, 0])), without(inputs, masks, torch.tensor([2, 0, 0])))


def test_centre_marker_appends_a_one_at_the_centre_step():
    """Without the skip, the marker is what tells the fused vector which step is predicted:
    the backbone equals the same modules fed the inputs with a hand-made marker channel."""
    torch.manual_seed(0)
    encoders = [ModalityEncoder(d + 1, kind="linear", hidden_dim=6, dropout=0.0) for d in DIMS]
    module = polyfuse.nn.create("man", input_dims=[6, 6, 6], out_dim=7)
    model = FusionBackbone(module, encoders, fusion_dim=7, out_dim=8, skip=False, centre_marker=True).eval()
    inputs, masks = window_batch(lengths=(4, 4, 3))
    centre = torch.tensor([2, 0, 1])
    marked = []
    for x in inputs:
        channel = torch.zeros(3, 4, 1)
        for b, c in enumerate([2, 0, 1]):
            channel[b, c, 0] = 1.0
        marked.append(torch.cat([x, channel], -1))
    encoded = [encoder(x, m) for encoder, x, m in zip(encoders, marked, masks, strict=True)]
    expected = model.projection(module(encoded, masks))
    torch.testing.assert_close(model(inputs, masks, centre), expected)
    other = model(inputs, masks, torch.tensor([3, 0, 1]))  # another centre, another output
    assert not torch.allclose(other[0], expected[0]) and torch.allclose(other[1:], expected[1:])
    with pytest.raises(ValueError, match="centre_marker needs the centre positions"):
        model(inputs, masks)


def test_input_groups_feed_ban_two_inputs():
    model = backbone("linear", "ban", groups=[[0], [1, 2]])
    inputs, masks = window_batch(lengths=(4, 4, 4))
    assert model(inputs, masks, torch.tensor([0, 1, 2])).shape == (3, 8)
    assert model.group_names() == ["m0", "m1+m2"]
    with pytest.raises(ValueError, match="at most once"):
        backbone("linear", "concat", groups=[[0, 1], [1, 2]])


def test_tasks_heads_and_losses():
    model = backbone("linear", "concat")
    inputs, masks = window_batch()
    batch = {"inputs": inputs, "masks": masks, "centre": torch.tensor([0, 1, 2]), "row": torch.arange(3)}
    sentiment = SentimentTask(model, loss="l1")
    outputs = sentiment(batch)
    target = torch.tensor([1.0, -2.0, 0.5])
    assert outputs.shape == (3, 1)
    torch.testing.assert_close(sentiment.compute_loss(outputs, target), (outputs[:, 0] - target).abs().mean())
    mse = SentimentTask(model, loss="mse")
    torch.testing.assert_close(mse.compute_loss(outputs, target), ((outputs[:, 0] - target) ** 2).mean())
    traits = TraitsTask(model, names=["a", "b"], ranges=[[1, 7], [1, 5]])
    assert traits(batch).shape == (3, 2)
    classes = ClassificationTask(model, num_classes=3)
    logits = classes(batch)
    labels = torch.tensor([0, 2, 1])
    expected = -torch.log_softmax(logits, dim=-1)[torch.arange(3), labels].mean()
    torch.testing.assert_close(classes.compute_loss(logits, labels), expected)
    torch.testing.assert_close(classes.predictions(logits).sum(dim=-1), torch.ones(3))


def test_a_bare_fusion_module_is_a_valid_model():
    fusion = polyfuse.nn.create("lmf", input_dims=list(DIMS), out_dim=4)
    task = SentimentTask(fusion)
    inputs, masks = window_batch()
    prediction = task({"inputs": inputs, "masks": masks, "row": torch.arange(3)})
    assert prediction.shape == (3, 1)
    # The task is the bare module and a linear head, nothing between them.
    expected = fusion(inputs, masks) @ task.head.weight.T + task.head.bias
    torch.testing.assert_close(prediction, expected)


def test_task_errors():
    model = backbone("linear", "concat")
    with pytest.raises(ValueError, match="unknown regression loss 'hinge'; expected one of l1, mse, smooth_l1"):
        SentimentTask(model, loss="hinge")
    with pytest.raises(ValueError, match="unknown scheduler 'linear'; expected one of none, cosine, ban_warmup, step"):
        SentimentTask(model, scheduler="linear")
    with pytest.raises(ValueError, match="the step scheduler needs decay_rate"):
        SentimentTask(model, scheduler="step")
    with pytest.raises(ValueError, match="at least 2 classes"):
        ClassificationTask(model, num_classes=1)
    with pytest.raises(ValueError, match="unknown encoder type 'lstm'; expected one of none, linear, gru"):
        ModalityEncoder(3, kind="lstm")
