"""Chimera's layers: each topic variant against its explicit mixture, the equations by
hand, padding invariance (padded vs truncated inputs), gradients, and input checks."""

import math

import pytest
import torch

from polyfuse.functional.chimera_losses import (
    chimera_objective,
    distortion_loss,
    hyperbolic_matching_loss,
    topic_lm_loss,
    topic_matching_loss,
)
from polyfuse.functional.lorentz import (
    lorentz_distance,
    lorentz_expmap0,
    lorentz_inner,
    lorentz_logmap0,
)
from polyfuse.nn.chimera import (
    TOPIC_VARIANTS,
    Chimera,
    HyperbolicLayer,
    MatchingLayer,
    TopicLayer,
)

HIDDEN = 12


def hidden_states(batch, length, seed=0, dtype=torch.float32, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, length, HIDDEN, generator=generator) * scale).to(dtype)


def lengths_to_mask(lengths, total):
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def pad_with_garbage(hidden, mask, value=float("nan")):
    return hidden.masked_fill(~mask.unsqueeze(-1), value)


# -------------------------------------------------------------------------- topics


@pytest.mark.parametrize("variant", TOPIC_VARIANTS)
def test_topic_layer_keeps_the_hidden_size_and_mixes_the_topic_states(variant):
    torch.manual_seed(0)
    layer = TopicLayer(HIDDEN, 5, variant=variant, init_std=0.3).double()
    hidden = hidden_states(2, 4, dtype=torch.float64)
    out = layer(hidden)
    assert out.hidden.shape == hidden.shape
    assert out.topic_probs.shape == out.topic_logits.shape == (2, 4, 5)
    assert torch.allclose(out.topic_probs.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    # Eq. 4: the prior is softmax(LayerNorm(h) W_Z)
    prior = torch.softmax(layer.norm(hidden) @ layer.topic_prior.weight.T, dim=-1)
    assert torch.allclose(out.topic_probs, prior)
    # H_T = sum_z P(z) T_z(h) with every T_z(h) built explicitly
    states = layer.topic_states(hidden)
    assert states.shape == (2, 4, 5, HIDDEN)
    assert torch.equal(states[..., 0, :], hidden)  # topic 0: the residual
    assert torch.allclose(out.hidden, torch.einsum("bnz,bnzd->bnd", prior, states), rtol=1e-12)


def test_topic_states_follow_eq_5_for_each_variant():
    torch.manual_seed(1)
    hidden = hidden_states(1, 3, dtype=torch.float64)
    h = hidden[0, 1]
    addition = TopicLayer(HIDDEN, 3, variant="addition").double()
    omega = torch.sigmoid(addition.addition_logit)
    expected = (1 - omega) * h + omega * addition.topic_vectors[1]
    assert torch.allclose(addition.topic_states(hidden)[0, 1, 2], expected)
    multiplication = TopicLayer(HIDDEN, 3, variant="multiplication").double()
    assert torch.allclose(multiplication.topic_states(hidden)[0, 1, 2], h * multiplication.topic_vectors[1])
    affine = TopicLayer(HIDDEN, 3, variant="affine").double()
    expected = h @ affine.topic_weights[1] + affine.topic_biases[1]
    assert torch.allclose(affine.topic_states(hidden)[0, 1, 2], expected)
    residual = TopicLayer(HIDDEN, 3, variant="residual").double()
    assert torch.equal(residual(hidden).hidden, hidden)
    assert torch.equal(TopicLayer(HIDDEN, 1, variant="affine").double()(hidden).hidden, hidden)


@pytest.mark.parametrize("variant", ["addition", "affine"])
def test_topic_layer_padding_changes_nothing(variant):
    torch.manual_seed(2)
    layer = TopicLayer(HIDDEN, 4, variant=variant)
    hidden = hidden_states(2, 6, seed=3)
    mask = lengths_to_mask([4, 6], 6)
    out = layer(pad_with_garbage(hidden, mask), mask)
    short = layer(hidden[:1, :4])
    assert torch.allclose(out.hidden[:1, :4], short.hidden, atol=1e-6)
    assert torch.allclose(out.topic_probs[:1, :4], short.topic_probs, atol=1e-6)
    assert torch.equal(out.hidden[0, 4:], torch.zeros(2, HIDDEN))
    assert torch.equal(out.topic_probs[0, 4:], torch.zeros(2, 4))


def test_topic_layer_feeds_the_topic_lm_loss():
    torch.manual_seed(4)
    layer = TopicLayer(HIDDEN, 3, variant="multiplication")
    vocabulary_head = torch.nn.Linear(HIDDEN, 9)  # W_{V|Z}, the encoder's own head
    hidden = hidden_states(2, 5, seed=5)
    targets = torch.randint(0, 9, (2, 5))
    out = layer(hidden)
    loss = topic_lm_loss(vocabulary_head(layer.topic_states(hidden)), out.topic_logits, targets)
    loss.backward()
    assert torch.isfinite(loss)
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_topic_layer_errors():
    with pytest.raises(ValueError, match="unknown topic variant 'sum'; available: residual"):
        TopicLayer(HIDDEN, variant="sum")
    layer = TopicLayer(HIDDEN, 2)
    with pytest.raises(ValueError, match=r"hidden has shape \(2, 3, 5\), expected \(B, N, 12\)"):
        layer(torch.zeros(2, 3, 5))
    bad = hidden_states(2, 3)
    bad[1, 2, 0] = float("inf")
    with pytest.raises(ValueError, match="hidden contains Inf"):
        layer(bad)
    with pytest.raises(ValueError, match="is all padding for sample"):
        layer(hidden_states(2, 3), torch.tensor([[True, False, False], [False, False, False]]))


# ---------------------------------------------------------------------- hyperbolic


def test_hyperbolic_layer_shapes_points_and_padding():
    torch.manual_seed(6)
    layer = HyperbolicLayer(HIDDEN, 5, beta=2.0, offset=0.5)
    hidden = hidden_states(2, 7, seed=7)
    mask = lengths_to_mask([7, 3], 7)
    out = layer(pad_with_garbage(hidden, mask), mask, return_weights=True)
    assert out.hidden.shape == hidden.shape
    assert out.points.shape == (2, 7, 6) and out.weights.shape == (2, 7, 7)
    residual = lorentz_inner(out.points.double(), out.points.double()) + 1
    assert (residual.abs() <= 1e-5 * out.points.double()[..., 0] ** 2).all()
    assert torch.equal(out.weights[1, :, 3:], torch.zeros(7, 4))  # padded keys
    assert torch.equal(out.hidden[1, 3:], torch.zeros(4, HIDDEN))
    short = layer(hidden[1:, :3])
    assert torch.allclose(out.hidden[1:, :3], short.hidden, atol=1e-5)
    assert torch.allclose(out.points[1:, :3], short.points, atol=1e-5)
    assert math.isclose(float(layer.beta.detach()), 2.0, rel_tol=1e-6)


def test_hyperbolic_layer_is_eq_8_on_the_projected_tokens():
    torch.manual_seed(8)
    layer = HyperbolicLayer(HIDDEN, 4, beta=0.5, offset=-1.0).double()
    hidden = hidden_states(1, 5, seed=9, dtype=torch.float64)
    out = layer(hidden, return_weights=True)
    queries = lorentz_expmap0(layer.query(hidden))
    keys = lorentz_expmap0(layer.key(hidden))
    values = lorentz_expmap0(layer.value(hidden))
    alpha = torch.sigmoid(-0.5 * lorentz_distance(queries[0, :, None], keys[0, None, :]) + 1.0)
    assert torch.allclose(out.weights[0], alpha, rtol=1e-10)
    klein = values[0, :, 1:] / values[0, :, :1]
    scaled = alpha * values[0, :, 0]  # alpha gamma, with gamma = x_0
    midpoint = (scaled / scaled.sum(-1, keepdim=True)) @ klein
    points = torch.cat((torch.ones(5, 1, dtype=torch.float64), midpoint), -1)
    points = points / torch.sqrt(1 - midpoint.pow(2).sum(-1, keepdim=True))
    assert torch.allclose(out.points[0], points, rtol=1e-9)
    assert torch.allclose(out.hidden[0], layer.output(lorentz_logmap0(points)), rtol=1e-9)


def test_hyperbolic_layer_embed_and_radius_cap():
    torch.manual_seed(10)
    layer = HyperbolicLayer(HIDDEN, 4, max_radius=2.0)
    hidden = hidden_states(2, 5, seed=11, scale=100.0)  # projections far beyond radius 2
    mask = lengths_to_mask([5, 2], 5)
    points, tangents = layer.embed(pad_with_garbage(hidden, mask), mask)
    assert points.shape == (2, 5) and tangents.shape == (2, 4)
    assert torch.allclose(points, lorentz_expmap0(tangents))
    assert (tangents.norm(dim=-1) <= 2.0 + 1e-5).all()
    short_points, _ = layer.embed(hidden[1:, :2])
    assert torch.allclose(points[1:], short_points, atol=1e-5)
    origin = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    radii = lorentz_distance(layer(hidden).points, origin)
    assert (radii <= 2.0 + 1e-4).all()


def test_hyperbolic_layer_embed_is_the_polar_form_of_the_mean_value_vector():
    """Sec. 3.6 / note 10: w is the Euclidean feature of a sequence, here the mean of the
    value vectors W_V h + b_V of its real tokens (each clipped at max_radius), and
    w~ = (cosh|w|, sinh|w| w / |w|) its polar form on the hyperboloid. By hand, from the
    value projection's weights (the query and key maps must play no part)."""
    torch.manual_seed(12)
    layer = HyperbolicLayer(HIDDEN, 3, max_radius=4.0).double()
    hidden = hidden_states(2, 4, seed=13, dtype=torch.float64, scale=0.6)
    hidden[0, 1] *= 40.0  # one token far outside the radius cap: clipped before the mean
    mask = lengths_to_mask([4, 3], 4)
    points, tangents = layer.embed(hidden, mask)
    weight, bias = layer.value.weight.detach(), layer.value.bias.detach()
    for b, length in enumerate([4, 3]):
        vectors = []
        for t in range(length):
            u = [sum(float(weight[i, k]) * float(hidden[b, t, k]) for k in range(HIDDEN)) + float(bias[i]) for i in range(3)]
            norm = math.sqrt(sum(c * c for c in u))
            vectors.append([c * min(1.0, 4.0 / norm) for c in u])
        w = [sum(v[i] for v in vectors) / length for i in range(3)]
        r = math.sqrt(sum(c * c for c in w))
        expected_point = [math.cosh(r)] + [math.sinh(r) * c / r for c in w]
        assert tangents[b].tolist() == pytest.approx(w, rel=1e-9)
        assert points[b].tolist() == pytest.approx(expected_point, rel=1e-9)
    # Bad input is refused with the argument named.
    with pytest.raises(ValueError, match=r"^hidden has shape \(2, 4, 5\), expected \(B, N, 12\)"):
        layer.embed(hidden[..., :5], mask)
    with pytest.raises(ValueError, match=r"^mask must be a bool tensor"):
        layer.embed(hidden, mask.int())


# ------------------------------------------------------------------------ matching


def test_matching_layer_is_eq_9():
    layer = MatchingLayer(topic_weight=0.3, visual_weight=0.8)
    hyperbolic, text, image = (hidden_states(2, 3, seed=s) for s in (12, 13, 14))
    expected = 0.7 * hyperbolic + 0.3 * (0.8 * image + 0.2 * text)
    out = layer(hyperbolic, text, image)
    assert torch.allclose(out, expected, atol=1e-6)
    out.sum().backward()
    assert layer.topic_logit.grad is not None and layer.visual_logit.grad is not None
    with pytest.raises(ValueError, match="topic_weight must lie strictly between 0 and 1"):
        MatchingLayer(topic_weight=1.0)
    with pytest.raises(ValueError, match="image_topic_hidden has shape"):
        layer(hyperbolic, text, image[:, :2])


# ------------------------------------------------------------------------- Chimera


def chimera_inputs(seed=15):
    text = hidden_states(3, 6, seed=seed)
    image = hidden_states(3, 4, seed=seed + 1)
    text_mask = lengths_to_mask([6, 2, 4], 6)
    image_mask = lengths_to_mask([4, 4, 1], 4)
    return text, image, text_mask, image_mask


def test_chimera_shapes_and_padding_changes_nothing():
    torch.manual_seed(16)
    model = Chimera(HIDDEN, num_topics=4, hyperbolic_dim=5)
    text, image, text_mask, image_mask = chimera_inputs()
    out = model(pad_with_garbage(text, text_mask), pad_with_garbage(image, image_mask), text_mask, image_mask)
    assert out.hidden.shape == (3, 10, HIDDEN) and out.mask.shape == (3, 10)
    assert out.text_topics.shape == out.image_topics.shape == (3, 4)
    assert torch.allclose(out.text_topics.sum(-1), torch.ones(3))
    assert out.text_points.shape == out.image_points.shape == (3, 6)
    assert out.text_tangents.shape == (3, 5)
    assert torch.equal(out.hidden[~out.mask], torch.zeros(int((~out.mask).sum()), HIDDEN))
    for b, (t, v) in enumerate([(6, 4), (2, 4), (4, 1)]):
        alone = model(text[b : b + 1, :t], image[b : b + 1, :v])
        real = out.hidden[b][out.mask[b]]
        assert torch.allclose(real, alone.hidden[0], atol=1e-5)
        for field in ("text_topics", "image_topics", "text_points", "image_points", "text_tangents"):
            assert torch.allclose(getattr(out, field)[b], getattr(alone, field)[0], atol=1e-5), field
        assert torch.allclose(out.text_topic_logits[b, :t], alone.text_topic_logits[0], atol=1e-5)


def test_chimera_combines_its_layers_as_in_eq_9():
    torch.manual_seed(17)
    model = Chimera(HIDDEN, num_topics=3, hyperbolic_dim=4, topic_weight=0.4, visual_weight=0.25)
    text, image = hidden_states(2, 3, seed=18), hidden_states(2, 2, seed=19)
    out = model(text, image)
    hyperbolic = model.hyperbolic(torch.cat((text, image), 1)).hidden
    text_topic = model.text_topic(text).hidden
    image_topic = model.image_topic(image).hidden
    expected_text = 0.6 * hyperbolic[:, :3] + 0.4 * 0.75 * text_topic
    expected_image = 0.6 * hyperbolic[:, 3:] + 0.4 * 0.25 * image_topic
    assert torch.allclose(out.hidden, torch.cat((expected_text, expected_image), 1), atol=1e-6)


def test_chimera_trains_every_parameter_through_the_objective():
    torch.manual_seed(20)
    model = Chimera(HIDDEN, num_topics=3, hyperbolic_dim=4).double()
    vocabulary_head = torch.nn.Linear(HIDDEN, 7).double()
    text, image, text_mask, image_mask = (
        t.double() if t.is_floating_point() else t for t in chimera_inputs(seed=21)
    )
    out = model(text, image, text_mask, image_mask)
    targets = torch.randint(0, 7, (3, 6)).masked_fill(~text_mask, -100)
    states = model.text_topic.topic_states(pad_with_garbage(text, text_mask), text_mask)
    assert torch.equal(states[~text_mask], torch.zeros_like(states[~text_mask]))
    text_lm = topic_lm_loss(vocabulary_head(states), out.text_topic_logits, targets)
    total = chimera_objective(
        topic_lm=text_lm,
        topic_matching=topic_matching_loss(out.text_topics, out.image_topics),
        hyperbolic_matching=hyperbolic_matching_loss(out.text_points, out.image_points, margin=5.0),
        distortion=distortion_loss(out.text_points, out.image_points, out.text_tangents, out.image_tangents),
        model_loss=out.hidden.pow(2).mean(),
    )
    total.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def test_chimera_input_errors():
    model = Chimera(HIDDEN, num_topics=2, hyperbolic_dim=3)
    text, image, text_mask, image_mask = chimera_inputs(seed=22)
    bad = text.clone()
    bad[1, 0, 3] = float("nan")  # a real token
    with pytest.raises(ValueError, match="text_hidden contains NaN"):
        model(bad, image, text_mask, image_mask)
    with pytest.raises(ValueError, match="batch size"):
        model(text, image[:2], text_mask, image_mask[:2])
    with pytest.raises(ValueError, match=r"image_hidden has shape \(3, 4, 5\)"):
        model(text, torch.zeros(3, 4, 5), text_mask)
    with pytest.raises(ValueError, match="image_mask must be a bool tensor"):
        model(text, image, text_mask, image_mask.float())
    with pytest.raises(ValueError, match="text_mask is all padding for sample"):
        model(text, image, torch.zeros_like(text_mask), image_mask)


# ------------------------------------------------ defaults, initial values, messages


def test_defaults_are_table_4s_best_and_the_initial_values_are_as_documented():
    torch.manual_seed(23)
    model = Chimera(64)
    for topic in (model.text_topic, model.image_topic):
        assert (topic.hidden_size, topic.num_topics, topic.variant) == (64, 20, "affine")
        assert topic.norm.eps == 1e-5 and topic.topic_prior.bias is None
        # W_{R|z} = I + N(0, 0.02^2), b_z = 0 for the 19 topics z > 0
        noise = topic.topic_weights.detach() - torch.eye(64)
        assert topic.topic_weights.shape == (19, 64, 64)
        assert abs(float(noise.std()) - 0.02) < 0.001 and abs(float(noise.mean())) < 0.001
        assert torch.equal(topic.topic_biases.detach(), torch.zeros(19, 64))
    hyperbolic = model.hyperbolic
    assert (hyperbolic.hidden_size, hyperbolic.hyperbolic_dim, hyperbolic.max_radius) == (64, 20, 10.0)
    assert float(hyperbolic.beta.detach()) == pytest.approx(1.0) and float(hyperbolic.offset.detach()) == 0.0
    assert float(model.matching.topic_weight.detach()) == pytest.approx(0.5)
    assert float(model.matching.visual_weight.detach()) == pytest.approx(0.5)
    assert model.hidden_size == 64
    addition = TopicLayer(64, 5, variant="addition")
    assert float(addition.addition_weight.detach()) == 0.5  # omega starts at 0.5
    assert abs(float(addition.topic_vectors.detach().std()) - 0.02) < 0.002
    multiplication = TopicLayer(64, 5, variant="multiplication", init_std=0.1)
    factors = multiplication.topic_vectors.detach()
    assert factors.shape == (4, 64)
    assert abs(float(factors.mean()) - 1.0) < 0.02 and abs(float(factors.std()) - 0.1) < 0.01
    layer = TopicLayer(3, 2, layer_norm_eps=0.5)
    assert layer.norm.eps == 0.5
    # the layer normalisation's eps reaches Eq. 4's prior
    hidden = torch.tensor([[[0.1, -0.2, 0.4]]])
    centred = hidden - hidden.mean(-1, keepdim=True)
    normed = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 0.5)
    expected = torch.softmax(normed @ layer.topic_prior.weight.T, dim=-1)
    assert torch.allclose(layer(hidden).topic_probs, expected, atol=1e-6)


def test_extra_repr_lists_the_settings():
    assert TopicLayer(4, 3, variant="addition").extra_repr() == "hidden_size=4, num_topics=3, variant='addition'"
    assert HyperbolicLayer(4, 2, max_radius=3.0).extra_repr() == "hidden_size=4, hyperbolic_dim=2, max_radius=3.0"


def test_one_sized_layers_are_accepted():
    hidden = torch.ones(1, 2, 1)
    assert torch.equal(TopicLayer(1, 1)(hidden).hidden, hidden)
    out = HyperbolicLayer(1, 1)(hidden)
    assert out.points.shape == (1, 2, 2)


def test_constructor_and_forward_messages_name_the_argument():
    cases = [
        (lambda: TopicLayer(0, 3), r"^hidden_size and num_topics must be positive, got 0 and 3$"),
        (lambda: TopicLayer(3, 0), r"^hidden_size and num_topics must be positive, got 3 and 0$"),
        (lambda: HyperbolicLayer(0, 3), r"^hidden_size and hyperbolic_dim must be positive, got 0 and 3$"),
        (lambda: HyperbolicLayer(3, 0), r"^hidden_size and hyperbolic_dim must be positive, got 3 and 0$"),
        (lambda: HyperbolicLayer(3, beta=0.0), r"^beta must be positive and finite, got 0.0$"),
        (lambda: HyperbolicLayer(3, beta=math.inf), r"^beta must be positive and finite, got inf$"),
        (lambda: HyperbolicLayer(3, offset=math.nan), r"^offset must be finite, got nan$"),
        (lambda: HyperbolicLayer(3, max_radius=0.0), r"^max_radius must be positive, got 0.0$"),
        (lambda: MatchingLayer(topic_weight=0.0), r"^topic_weight must lie strictly between 0 and 1, got 0.0$"),
        (lambda: MatchingLayer(visual_weight=1.0), r"^visual_weight must lie strictly between 0 and 1, got 1.0$"),
        (lambda: TopicLayer(3, 2).addition_weight, None),
    ]
    for call, message in cases:
        if message is None:
            # nn.Module.__getattr__ replaces a property's AttributeError by its own
            # message, which still names the attribute
            with pytest.raises(AttributeError, match="addition_weight"):
                call()
            continue
        with pytest.raises(ValueError, match=message):
            call()
    layer = TopicLayer(HIDDEN, 2)
    with pytest.raises(ValueError, match=r"^hidden must be a float tensor of shape \(B, N, 12\)$"):
        layer(torch.zeros(2, 3, HIDDEN, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^hidden must be a float tensor of shape \(B, N, 12\)$"):
        layer.topic_states([[0.0] * HIDDEN])
    with pytest.raises(ValueError, match=r"^hidden has shape \(2, 0, 12\), expected \(B, N, 12\) with N >= 1$"):
        layer(torch.zeros(2, 0, HIDDEN))
    with pytest.raises(ValueError, match=r"^hidden has shape \(3, 12\), expected \(B, N, 12\) with N >= 1$"):
        layer(torch.zeros(3, HIDDEN))
    with pytest.raises(ValueError, match=r"^mask has shape \(2, 2\), expected \(2, 3\)$"):
        layer.topic_states(torch.zeros(2, 3, HIDDEN), torch.ones(2, 2, dtype=torch.bool))
    matching = MatchingLayer()
    good = torch.zeros(2, 3, 4)
    for position, name in enumerate(("hyperbolic_hidden", "text_topic_hidden", "image_topic_hidden")):
        args = [good, good, good]
        args[position] = good.long()
        with pytest.raises(ValueError, match=rf"^{name} must be a float tensor$"):
            matching(*args)
        args[position] = good.clone()
        args[position][1, 2, 3] = math.nan
        with pytest.raises(ValueError, match=rf"^{name} contains NaN at index \(1, 2, 3\)$"):
            matching(*args)
    with pytest.raises(ValueError, match=r"^text_topic_hidden has shape \(2, 2, 4\), hyperbolic_hidden has \(2, 3, 4\)$"):
        matching(good, good[:, :2], good)
    model = Chimera(HIDDEN, num_topics=2, hyperbolic_dim=3)
    text, image, text_mask, image_mask = chimera_inputs(seed=24)
    with pytest.raises(ValueError, match=r"^text_hidden has batch size 3, image_hidden has 2$"):
        model(text, image[:2], text_mask, image_mask[:2])
    with pytest.raises(ValueError, match=r"^text_hidden has shape \(3, 6, 5\)"):
        model(text[..., :5], image)
    with pytest.raises(ValueError, match=r"^text_mask has shape \(3, 5\), expected \(3, 6\)$"):
        model(text, image, text_mask[:, :5], image_mask)
    bad = image.clone()
    bad[2, 0, 1] = math.inf
    with pytest.raises(ValueError, match=r"^image_hidden contains Inf at index \(2, 0, 1\)$"):
        model(text, bad, text_mask, image_mask)


@pytest.mark.parametrize("variant", TOPIC_VARIANTS)
def test_topic_states_and_mixture_at_padded_tokens_are_zero(variant):
    torch.manual_seed(25)
    layer = TopicLayer(HIDDEN, 3, variant=variant, init_std=0.3)
    hidden = hidden_states(2, 4, seed=26)
    mask = lengths_to_mask([4, 2], 4)
    states = layer.topic_states(pad_with_garbage(hidden, mask, 7.0), mask)
    assert torch.equal(states[1, 2:], torch.zeros(2, 3, HIDDEN))
    short = layer.topic_states(hidden[1:, :2])
    assert torch.allclose(states[1:, :2], short, atol=1e-6)
    out = layer(pad_with_garbage(hidden, mask, 7.0), mask)
    assert torch.equal(out.hidden[1, 2:], torch.zeros(2, HIDDEN))
    assert torch.equal(out.topic_logits[1, 2:], torch.zeros(2, 3))
    assert torch.allclose(out.hidden[1:, :2], layer(hidden[1:, :2]).hidden, atol=1e-6)


def test_chimera_in_float16_is_computed_in_float32():
    torch.manual_seed(27)
    model = Chimera(HIDDEN, num_topics=3, hyperbolic_dim=4)
    text, image, text_mask, image_mask = chimera_inputs(seed=28)
    text, image = text.half(), image.half()
    reference = model(text.float(), image.float(), text_mask, image_mask)
    out = model(text, image, text_mask, image_mask)
    assert out.hidden.dtype == torch.float16
    assert torch.allclose(out.hidden.float(), reference.hidden, atol=2e-3, rtol=1e-3)
    assert torch.allclose(out.text_points.float(), reference.text_points, atol=2e-3, rtol=1e-3)


def test_each_layer_built_alone_has_the_documented_defaults():
    topic = TopicLayer(HIDDEN)
    assert (topic.num_topics, topic.variant) == (20, "affine")
    hyperbolic = HyperbolicLayer(HIDDEN)
    assert (hyperbolic.hyperbolic_dim, hyperbolic.max_radius) == (20, 10.0)
    assert float(hyperbolic.beta.detach()) == pytest.approx(1.0) and float(hyperbolic.offset.detach()) == 0.0
    assert hyperbolic(hidden_states(2, 3)).weights is None  # weights only on request
    small_cap = HyperbolicLayer(HIDDEN, 3, max_radius=0.5)  # any positive cap, also below 1
    tangents = small_cap.embed(hidden_states(2, 3, scale=30.0))[1]
    assert float(tangents.detach().norm(dim=-1).max()) <= 0.5 + 1e-6


def test_chimera_passes_its_settings_to_its_layers():
    model = Chimera(HIDDEN, num_topics=3, topic_variant="addition", hyperbolic_dim=4, beta=2.0, offset=0.5,
                    max_radius=3.0)
    assert model.text_topic.variant == model.image_topic.variant == "addition"
    hyperbolic = model.hyperbolic
    assert float(hyperbolic.beta.detach()) == pytest.approx(2.0) and float(hyperbolic.offset.detach()) == 0.5
    assert hyperbolic.max_radius == 3.0


def test_layer_messages_name_hidden_mask_and_the_variants():
    with pytest.raises(ValueError, match=r"^unknown topic variant 'sum'; available: residual, addition, "
                                         r"multiplication, affine$"):
        TopicLayer(HIDDEN, 3, variant="sum")
    hidden = hidden_states(2, 3)
    short_mask = torch.ones(2, 2, dtype=torch.bool)
    for layer in (TopicLayer(HIDDEN, 2), HyperbolicLayer(HIDDEN, 3)):
        with pytest.raises(ValueError, match=r"^mask has shape \(2, 2\), expected \(2, 3\)$"):
            layer(hidden, short_mask)
        with pytest.raises(ValueError, match=r"^hidden has shape \(2, 3, 5\), expected \(B, N, 12\) with N >= 1$"):
            layer(hidden[..., :5])


def test_affine_topics_follow_eq_5_with_their_biases_and_start_apart():
    """T_z(h) = h W_{R|z} + b_z with non-zero b_z, by hand; the initial noise differs per topic."""
    torch.manual_seed(30)
    layer = TopicLayer(4, 3, variant="affine", init_std=0.1).double()
    assert not torch.equal(layer.topic_weights[0], layer.topic_weights[1])
    with torch.no_grad():
        layer.topic_biases.copy_(torch.arange(8, dtype=torch.float64).reshape(2, 4) / 10)
    hidden = torch.randn(1, 2, 4, dtype=torch.float64)
    states = layer.topic_states(hidden)
    for z in (1, 2):
        expected = hidden[0] @ layer.topic_weights[z - 1] + layer.topic_biases[z - 1]
        torch.testing.assert_close(states[0, :, z], expected)
    prior = layer(hidden).topic_probs[0]
    mixture = sum(prior[:, z : z + 1] * states[0, :, z] for z in range(3))
    torch.testing.assert_close(layer(hidden).hidden[0], mixture)


def test_chimera_topic_logits_are_each_sides_own_and_zero_at_padding():
    torch.manual_seed(31)
    model = Chimera(HIDDEN, num_topics=3, hyperbolic_dim=4)
    with torch.no_grad():  # as after training: LayerNorm(0) = its bias, whose prior logits are not 0
        model.text_topic.norm.bias.normal_()
        model.image_topic.norm.bias.normal_()
    text, image, text_mask, image_mask = chimera_inputs(seed=32)
    out = model(text, image, text_mask, image_mask)
    torch.testing.assert_close(out.text_topic_logits, model.text_topic(text, text_mask).topic_logits)
    torch.testing.assert_close(out.image_topic_logits, model.image_topic(image, image_mask).topic_logits)
    assert torch.equal(out.text_topic_logits[1, 2:], torch.zeros(4, 3))  # text of sample 1 has 2 tokens
    assert torch.equal(out.image_topic_logits[2, 1:], torch.zeros(3, 3))  # image of sample 2 has 1


@pytest.mark.parametrize("half_side", ["text", "image"])
def test_chimera_with_one_side_in_float16_is_computed_in_float32(half_side):
    torch.manual_seed(33)
    model = Chimera(HIDDEN, num_topics=3, hyperbolic_dim=4)
    text, image, text_mask, image_mask = chimera_inputs(seed=34)
    reference = model(text, image, text_mask, image_mask)
    text, image = (text.half(), image) if half_side == "text" else (text, image.half())
    out = model(text, image, text_mask, image_mask)
    assert torch.allclose(out.hidden.float(), reference.hidden, atol=3e-3, rtol=1e-3)
