"""Chimera's losses against direct hand computations: loops over positions, pairs and
topics, torch's cross-entropy, geoopt's distance."""

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
from polyfuse.functional.lorentz import lorentz_expmap0

# imported after polyfuse, which silences geoopt's torch.jit deprecation warnings
geoopt = pytest.importorskip("geoopt")
geoopt_math = geoopt.manifolds.lorentz.math

DOUBLE = torch.float64
UNIT = torch.tensor(1.0, dtype=DOUBLE)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DOUBLE) * scale


def geoopt_distance(x, y):
    return geoopt_math.dist(x, y, k=UNIT)


# ------------------------------------------------------------------------ L_T, Eq. 3


def test_topic_lm_loss_equals_a_loop_over_positions_and_topics():
    batch, length, topics, vocab = 2, 4, 3, 7
    vocab_logits = randn(batch, length, topics, vocab, seed=1)
    topic_logits = randn(batch, length, topics, seed=2)
    targets = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(3))
    targets[0, 1] = -100  # not a masked token
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, 3] = False
    total, count = 0.0, 0
    for b in range(batch):
        for t in range(length):
            if targets[b, t] == -100 or not mask[b, t]:
                continue
            prior = torch.softmax(topic_logits[b, t], dim=0)
            likelihood = sum(
                torch.softmax(vocab_logits[b, t, z], dim=0)[targets[b, t]] * prior[z]
                for z in range(topics)
            )
            total -= math.log(float(likelihood))
            count += 1
    loss = topic_lm_loss(vocab_logits, topic_logits, targets, mask)
    assert math.isclose(float(loss), total / count, rel_tol=1e-12)
    summed = topic_lm_loss(vocab_logits, topic_logits, targets, mask, reduction="sum")
    assert math.isclose(float(summed), total, rel_tol=1e-12)


def test_topic_lm_loss_with_one_topic_is_cross_entropy():
    vocab_logits = randn(3, 5, 1, 11, seed=4)
    targets = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(5))
    loss = topic_lm_loss(vocab_logits, torch.zeros(3, 5, 1, dtype=DOUBLE), targets)
    reference = torch.nn.functional.cross_entropy(vocab_logits[..., 0, :].reshape(15, 11), targets.reshape(15))
    assert torch.allclose(loss, reference, rtol=1e-12)


def test_topic_lm_loss_without_counted_positions_is_zero_with_a_gradient():
    vocab_logits = randn(1, 2, 2, 3, seed=6).requires_grad_()
    loss = topic_lm_loss(vocab_logits, randn(1, 2, 2, seed=7), torch.full((1, 2), -100))
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.equal(vocab_logits.grad, torch.zeros_like(vocab_logits))


def test_topic_lm_loss_gradcheck_and_errors():
    vocab_logits = randn(2, 3, 2, 4, seed=8).requires_grad_()
    topic_logits = randn(2, 3, 2, seed=9).requires_grad_()
    targets = torch.tensor([[0, 3, -100], [2, 1, 1]])
    assert torch.autograd.gradcheck(lambda v, z: topic_lm_loss(v, z, targets), (vocab_logits, topic_logits))
    with pytest.raises(ValueError, match="targets must lie in"):
        topic_lm_loss(vocab_logits, topic_logits, torch.full((2, 3), 4))
    with pytest.raises(ValueError, match="topic_logits has shape"):
        topic_lm_loss(vocab_logits, topic_logits[..., :1], targets)
    with pytest.raises(ValueError, match="int64"):
        topic_lm_loss(vocab_logits, topic_logits, targets.float())
    bad = vocab_logits.detach().clone()
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"topic_vocab_logits .* contains NaN"):
        topic_lm_loss(bad, topic_logits, targets)
    bad[1, 0] = 0.0
    bad[0, 2, 0, 0] = float("nan")  # at an ignored position: fine
    assert torch.isfinite(topic_lm_loss(bad, topic_logits, targets))
    with pytest.raises(ValueError, match="reduction"):
        topic_lm_loss(vocab_logits, topic_logits, targets, reduction="none")


# ---------------------------------------------------------------------- TLM, Eq. 10


def test_topic_matching_loss_is_cross_entropy_over_in_batch_negatives():
    texts, images = randn(5, 4, seed=10), randn(5, 4, seed=11)
    scores = texts @ images.T
    reference = torch.nn.functional.cross_entropy(scores, torch.arange(5))
    assert torch.allclose(topic_matching_loss(texts, images), reference, rtol=1e-12)
    # Eq. 10 written out: the positive against the N = B - 1 other images
    terms = []
    for b in range(5):
        positive = torch.exp(texts[b] @ images[b])
        negatives = sum(torch.exp(texts[b] @ images[n]) for n in range(5) if n != b)
        terms.append(-torch.log(positive / (positive + negatives)))
    assert torch.allclose(topic_matching_loss(texts, images), torch.stack(terms).mean(), rtol=1e-12)
    # temperature and the symmetric (CLIP) variant
    warm = torch.nn.functional.cross_entropy(scores / 0.1, torch.arange(5))
    assert torch.allclose(topic_matching_loss(texts, images, temperature=0.1), warm, rtol=1e-12)
    both = 0.5 * (reference + torch.nn.functional.cross_entropy(scores.T, torch.arange(5)))
    assert torch.allclose(topic_matching_loss(texts, images, symmetric=True), both, rtol=1e-12)


def test_topic_matching_loss_gradcheck_and_errors():
    texts, images = randn(3, 4, seed=12).requires_grad_(), randn(3, 4, seed=13).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, i: topic_matching_loss(t, i, symmetric=True), (texts, images))
    with pytest.raises(ValueError, match="at least 2 pairs"):
        topic_matching_loss(texts[:1], images[:1])
    with pytest.raises(ValueError, match="same shape"):
        topic_matching_loss(texts, images[:2])
    with pytest.raises(ValueError, match="temperature"):
        topic_matching_loss(texts, images, temperature=0.0)
    with pytest.raises(ValueError, match="image_topics contains Inf"):
        topic_matching_loss(texts, torch.full((3, 4), float("inf"), dtype=DOUBLE))


# ---------------------------------------------------------------------- HLM, Eq. 11


def hinge_by_pairs(texts, images, margin, symmetric=False):
    terms = []
    batch = len(texts)
    for j in range(batch):
        positive = geoopt_distance(texts[j], images[j]) ** 2
        for k in range(batch):
            if k != j:
                negative = geoopt_distance(texts[k], images[j]) ** 2
                terms.append(torch.clamp(margin + positive - negative, min=0))
    if symmetric:
        for i in range(batch):
            positive = geoopt_distance(texts[i], images[i]) ** 2
            for n in range(batch):
                if n != i:
                    negative = geoopt_distance(texts[i], images[n]) ** 2
                    terms.append(torch.clamp(margin + positive - negative, min=0))
    return torch.stack(terms)


def test_hyperbolic_matching_loss_equals_the_hinge_over_explicit_pairs():
    texts = lorentz_expmap0(randn(4, 3, seed=14))
    images = lorentz_expmap0(randn(4, 3, seed=15))
    for symmetric in (False, True):
        terms = hinge_by_pairs(texts, images, 1.5, symmetric)
        assert (terms > 0).any() and (terms == 0).any()  # the example exercises both sides
        loss = hyperbolic_matching_loss(texts, images, margin=1.5, symmetric=symmetric)
        assert torch.allclose(loss, terms.mean(), rtol=1e-10)
        summed = hyperbolic_matching_loss(texts, images, margin=1.5, symmetric=symmetric, reduction="sum")
        assert torch.allclose(summed, terms.sum(), rtol=1e-10)


def test_hyperbolic_matching_loss_is_zero_when_negatives_are_farther_by_the_margin():
    direction = torch.tensor([1.0, 0.0, 0.0], dtype=DOUBLE)
    radii = torch.tensor([0.0, 2.0, 4.0, 6.0], dtype=DOUBLE)
    texts = lorentz_expmap0(radii[:, None] * direction)
    # on one geodesic: each image 0.3 beyond its text, every other text at least 1.7
    # away, so every squared gap is at least 1.7^2 - 0.3^2 = 2.8
    images = lorentz_expmap0((radii[:, None] + 0.3) * direction)
    assert float(hyperbolic_matching_loss(texts, images, margin=2.75, symmetric=True)) == 0.0
    # a margin above the smallest gap makes it positive
    assert float(hyperbolic_matching_loss(texts, images, margin=2.85)) > 0.0


def test_hyperbolic_matching_loss_gradcheck_and_errors():
    texts = lorentz_expmap0(randn(3, 2, seed=16)).requires_grad_()
    images = lorentz_expmap0(randn(3, 2, seed=17)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t, i: hyperbolic_matching_loss(t, i, margin=2.0, symmetric=True), (texts, images)
    )
    with pytest.raises(ValueError, match="margin"):
        hyperbolic_matching_loss(texts, images, margin=0.0)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        hyperbolic_matching_loss(texts[:1], images[:1])
    with pytest.raises(ValueError, match="text_points and image_points must be"):
        hyperbolic_matching_loss(texts[0], images[0])


# ------------------------------------------------------------------------ L_D, Eq. 12


def test_distortion_loss_equals_a_loop_over_all_pairs():
    text_tangents, image_tangents = randn(3, 4, seed=18), randn(3, 4, seed=19)
    texts, images = lorentz_expmap0(text_tangents), lorentz_expmap0(image_tangents)
    terms = []
    for k in range(3):
        for j in range(3):  # the positive pairs (k = j) and the negative pairs (k != j)
            lorentz = geoopt_distance(texts[k], images[j])
            euclidean = torch.dist(text_tangents[k], image_tangents[j])
            terms.append(torch.abs(lorentz - euclidean) / euclidean)
    terms = torch.stack(terms)
    loss = distortion_loss(texts, images, text_tangents, image_tangents)
    assert torch.allclose(loss, terms.mean(), rtol=1e-10)
    summed = distortion_loss(texts, images, text_tangents, image_tangents, reduction="sum")
    assert torch.allclose(summed, terms.sum(), rtol=1e-10)


def test_distortion_loss_vanishes_on_a_geodesic_through_the_origin():
    # exp_0 is an isometry on a line through the origin: no distortion at all
    direction = torch.tensor([0.6, 0.0, -0.8], dtype=DOUBLE)
    text_tangents = torch.tensor([[-1.0], [0.5], [3.0]], dtype=DOUBLE) * direction
    image_tangents = torch.tensor([[2.0], [-0.25], [1.0]], dtype=DOUBLE) * direction
    loss = distortion_loss(
        lorentz_expmap0(text_tangents), lorentz_expmap0(image_tangents), text_tangents, image_tangents
    )
    assert float(loss) < 1e-12
    # off the line the hyperbolic distances are larger: positive distortion
    bent = image_tangents + torch.tensor([0.0, 1.0, 0.0], dtype=DOUBLE)
    assert float(distortion_loss(lorentz_expmap0(text_tangents), lorentz_expmap0(bent), text_tangents, bent)) > 0.01


def test_distortion_loss_gradcheck_coinciding_embeddings_and_errors():
    text_tangents = randn(2, 3, seed=20).requires_grad_()
    image_tangents = randn(2, 3, seed=21).requires_grad_()

    def loss(t, i):
        return distortion_loss(lorentz_expmap0(t), lorentz_expmap0(i), t, i)

    assert torch.autograd.gradcheck(loss, (text_tangents, image_tangents))
    same = text_tangents.detach().clone().requires_grad_()
    value = loss(same, same.detach().clone())  # d_E = 0 on the diagonal: finite, zero term there
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(same.grad).all()
    points = lorentz_expmap0(text_tangents.detach())
    with pytest.raises(ValueError, match="text_embeddings has 2 rows but text_points has 1"):
        distortion_loss(points[:1], points[:1], text_tangents[:2, :], image_tangents[:2, :])
    with pytest.raises(ValueError, match="eps"):
        distortion_loss(points, points, text_tangents, image_tangents, eps=0.0)


# ---------------------------------------------------------------- objective, Eq. 13


def test_chimera_objective_weights_the_terms_with_the_papers_lambdas():
    losses = {
        "topic_lm": torch.tensor(1.0),
        "topic_matching": torch.tensor(2.0),
        "hyperbolic_matching": torch.tensor(3.0),
        "distortion": torch.tensor(4.0),
        "model_loss": torch.tensor(5.0),
    }
    assert float(chimera_objective(**losses)) == 0.5 * (1 + 2 + 3 + 4) + 1.0 * 5
    weighted = chimera_objective(**losses, topic_lm_weight=2.0, model_loss_weight=0.0)
    assert float(weighted) == 2.0 * 1 + 0.5 * (2 + 3 + 4)
    # left-out terms (Table 4's ablations) are skipped
    assert float(chimera_objective(topic_matching=torch.tensor(2.0), model_loss=torch.tensor(5.0))) == 6.0


def test_chimera_objective_errors():
    with pytest.raises(ValueError, match="at least one loss term"):
        chimera_objective()
    with pytest.raises(ValueError, match="distortion must be a scalar"):
        chimera_objective(distortion=torch.ones(2))
    with pytest.raises(ValueError, match="topic_lm contains NaN"):
        chimera_objective(topic_lm=torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="distortion_weight"):
        chimera_objective(distortion=torch.tensor(1.0), distortion_weight=-1.0)


# ------------------------------------------------------- defaults and messages, by hand


def test_default_margin_eps_and_reduction_by_hand():
    # two texts and two images on one geodesic, at radii 0, 1 (texts) and 0.25, 0.5
    # (images): squared distances d^2(w_k, v_j) = (r_k - s_j)^2
    direction = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    texts = lorentz_expmap0(torch.tensor([[0.0], [1.0]], dtype=DOUBLE) * direction)
    images = lorentz_expmap0(torch.tensor([[0.25], [0.5]], dtype=DOUBLE) * direction)
    positives = [0.25**2, 0.5**2]
    # column j: [1 + d^2(w_j, v_j) - d^2(w_k, v_j)]_+ for k != j, margin 1 by default
    terms = [1 + positives[0] - 0.75**2, 1 + positives[1] - 0.5**2]
    assert float(hyperbolic_matching_loss(texts, images)) == pytest.approx(sum(terms) / 2, rel=1e-12)
    # row i (symmetric): [1 + d^2(w_i, v_i) - d^2(w_i, v_l)]_+ for l != i
    rows = [1 + positives[0] - 0.5**2, 1 + positives[1] - 0.75**2]
    both = hyperbolic_matching_loss(texts, images, symmetric=True, reduction="sum")
    assert float(both) == pytest.approx(sum(terms) + sum(rows), rel=1e-12)
    # L_D with the default eps: coinciding embeddings give |d_L - 0| / 1e-6
    tangents = torch.tensor([[0.0, 0.0], [0.0, 0.0]], dtype=DOUBLE)
    loss = distortion_loss(texts, images, tangents, tangents)
    distances = [0.25, 0.5, 0.75, 0.5]  # (w_0, v_0), (w_0, v_1), (w_1, v_0), (w_1, v_1)
    assert float(loss) == pytest.approx(sum(distances) / 4 / 1e-6, rel=1e-9)
    # and the default temperature 1 and direction (text to image) of L_TLM
    text_topics = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=DOUBLE)
    image_topics = torch.tensor([[0.6, 0.4], [0.5, 0.5]], dtype=DOUBLE)
    scores = [[0.54, 0.5], [0.44, 0.5]]
    expected = sum(
        -math.log(math.exp(scores[b][b]) / sum(math.exp(s) for s in scores[b])) for b in range(2)
    ) / 2
    assert float(topic_matching_loss(text_topics, image_topics)) == pytest.approx(expected, rel=1e-12)


def test_topic_lm_loss_messages_name_the_argument():
    vocab_logits, topic_logits = randn(2, 3, 2, 4, seed=8), randn(2, 3, 2, seed=9)
    targets = torch.tensor([[0, 3, -100], [2, 1, 1]])
    with pytest.raises(ValueError, match=r"^reduction must be one of \('mean', 'sum'\), got 'none'$"):
        topic_lm_loss(vocab_logits, topic_logits, targets, reduction="none")
    with pytest.raises(ValueError, match=r"^targets must be an int64 tensor of token ids$"):
        topic_lm_loss(vocab_logits, topic_logits, targets.tolist())
    with pytest.raises(
        ValueError,
        match=r"^topic_logits has shape \(2, 3, 1\), expected \(2, 3, 2\) for topic_vocab_logits \(2, 3, 2, 4\)$",
    ):
        topic_lm_loss(vocab_logits, topic_logits[..., :1], targets)
    with pytest.raises(ValueError, match=r"^targets has shape \(2, 2\), expected \(2, 3\)$"):
        topic_lm_loss(vocab_logits, topic_logits, targets[:, :2])
    mask = torch.ones(2, 3, dtype=torch.bool)
    message = r"^mask must be a bool tensor of shape \(2, 3\) \(True = counts\)$"
    for bad_mask in (mask.long(), mask[:, :2], mask.tolist()):
        with pytest.raises(ValueError, match=message):
            topic_lm_loss(vocab_logits, topic_logits, targets, bad_mask)
    with pytest.raises(ValueError, match=r"^targets must lie in \[0, 4\) at counted positions$"):
        topic_lm_loss(vocab_logits, topic_logits, torch.tensor([[0, 3, -100], [2, -1, 1]]))
    bad = topic_logits.clone()
    bad[1, 2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^topic_logits \(at counted positions\) contains Inf"):
        topic_lm_loss(vocab_logits, bad, targets)
    # an Inf at a position the mask leaves out is never read
    mask[1, 2] = False
    assert torch.isfinite(topic_lm_loss(vocab_logits, bad, targets, mask))
    # a target out of range where the mask leaves it out is not read either
    out_of_range = targets.clone()
    out_of_range[1, 2] = 99
    assert torch.isfinite(topic_lm_loss(vocab_logits, topic_logits, out_of_range, mask))


def test_pair_losses_messages_name_the_arguments():
    texts = lorentz_expmap0(randn(3, 2, seed=16))
    images = lorentz_expmap0(randn(3, 2, seed=17))
    with pytest.raises(
        ValueError, match=r"^text_points and image_points must be \(B, size\) tensors, got \(3,\) and \(3,\)$"
    ):
        hyperbolic_matching_loss(texts[0], images[0])
    with pytest.raises(
        ValueError, match=r"^text_points and image_points must be \(B, size\) tensors, got \(3, 3\) and \(1, 3, 3\)$"
    ):
        hyperbolic_matching_loss(texts, images[None])
    with pytest.raises(
        ValueError,
        match=r"^text_points \(3, 3\) and image_points \(2, 3\) must have the same shape \(one pair per row\)$",
    ):
        hyperbolic_matching_loss(texts, images[:2])
    with pytest.raises(ValueError, match=r"^hyperbolic_matching_loss needs a batch of at least 2 pairs"):
        hyperbolic_matching_loss(texts[:1], images[:1])
    with pytest.raises(ValueError, match=r"^margin must be positive, got -1.0$"):
        hyperbolic_matching_loss(texts, images, margin=-1.0)
    with pytest.raises(ValueError, match=r"^reduction must be one of"):
        hyperbolic_matching_loss(texts, images, reduction="max")
    with pytest.raises(ValueError, match=r"^topic_matching_loss needs a batch of at least 2 pairs"):
        topic_matching_loss(randn(1, 4), randn(1, 4))
    with pytest.raises(ValueError, match=r"^temperature must be positive, got 0.0$"):
        topic_matching_loss(randn(2, 4), randn(2, 4), temperature=0.0)
    with pytest.raises(ValueError, match=r"^text_topics contains NaN"):
        topic_matching_loss(torch.full((2, 4), float("nan"), dtype=DOUBLE), randn(2, 4))
    tangents = randn(3, 2, seed=18)
    with pytest.raises(ValueError, match=r"^text_embeddings \(3, 2\) and image_embeddings \(2, 2\) must have"):
        distortion_loss(texts, images, tangents, tangents[:2])
    with pytest.raises(ValueError, match=r"^text_embeddings has 3 rows but text_points has 2$"):
        distortion_loss(texts[:2], images[:2], tangents, tangents)
    with pytest.raises(ValueError, match=r"^eps must be positive, got 0.0$"):
        distortion_loss(texts, images, tangents, tangents, eps=0.0)
    with pytest.raises(ValueError, match=r"^reduction must be one of"):
        distortion_loss(texts, images, tangents, tangents, reduction="none")
    bad = tangents.clone()
    bad[2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^image_embeddings contains Inf"):
        distortion_loss(texts, images, tangents, bad)
    with pytest.raises(ValueError, match=r"^text_embeddings contains Inf"):
        distortion_loss(texts, images, bad, tangents)


def test_chimera_objective_messages_and_weights_by_hand():
    one = torch.tensor(1.0, dtype=DOUBLE)
    for name in ("topic_lm", "topic_matching", "hyperbolic_matching", "distortion", "model_loss"):
        with pytest.raises(ValueError, match=rf"^{name}_weight must be finite and non-negative, got inf$"):
            chimera_objective(**{name: one, f"{name}_weight": float("inf")})
        with pytest.raises(ValueError, match=rf"^{name}_weight must be finite and non-negative, got nan$"):
            chimera_objective(**{name: one, f"{name}_weight": float("nan")})
        with pytest.raises(ValueError, match=rf"^{name} must be a scalar float tensor$"):
            chimera_objective(**{name: torch.tensor(1)})
        with pytest.raises(ValueError, match=rf"^{name} must be a scalar float tensor$"):
            chimera_objective(**{name: 1.0})
        # each term alone, with its default lambda (0.5, 0.5, 0.5, 0.5, 1.0), and a (1,)-shaped loss
        alone = chimera_objective(**{name: torch.tensor([3.0], dtype=DOUBLE)})
        assert alone.shape == () and float(alone) == (3.0 if name == "model_loss" else 1.5)
        # a weight of 0 keeps the term (at zero), unlike a missing term
        assert float(chimera_objective(**{name: one, f"{name}_weight": 0.0})) == 0.0
    with pytest.raises(ValueError, match=r"^chimera_objective needs at least one loss term$"):
        chimera_objective(topic_lm_weight=1.0)


def test_every_tensor_argument_is_named_in_its_type_and_shape_messages():
    texts, images = lorentz_expmap0(randn(3, 2, seed=20)), lorentz_expmap0(randn(3, 2, seed=21))
    tangents, topics = randn(3, 2, seed=22), randn(3, 4, seed=23)
    vocab_logits, topic_logits, targets = randn(2, 3, 4, seed=24), randn(2, 3, seed=25), torch.tensor([1, 3])
    cases = [
        (lambda: topic_lm_loss(vocab_logits.long(), topic_logits, targets), "topic_vocab_logits must be a float"),
        (lambda: topic_lm_loss(vocab_logits[0, 0], topic_logits, targets), r"topic_vocab_logits must have at least 2"),
        (lambda: topic_lm_loss(vocab_logits, topic_logits.long(), targets), "topic_logits must be a float"),
        (lambda: topic_matching_loss(topics.long(), topics), "text_topics must be a float"),
        (lambda: topic_matching_loss(topics, topics.long()), "image_topics must be a float"),
        (lambda: topic_matching_loss(topics, topics[:2]), r"text_topics \(3, 4\) and image_topics \(2, 4\) must"),
        (lambda: hyperbolic_matching_loss(texts.long(), images), "text_points must be a float"),
        (lambda: hyperbolic_matching_loss(texts, images.long()), "image_points must be a float"),
        (lambda: distortion_loss(texts.long(), images, tangents, tangents), "text_points must be a float"),
        (lambda: distortion_loss(texts, images.long(), tangents, tangents), "image_points must be a float"),
        (lambda: distortion_loss(texts, images[:2], tangents, tangents), r"text_points \(3, 3\) and image_points \(2, 3\)"),
        (lambda: distortion_loss(texts, images, tangents.long(), tangents), "text_embeddings must be a float"),
        (lambda: distortion_loss(texts, images, tangents, tangents.long()), "image_embeddings must be a float"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match="^" + message):
            call()
    nan_logits = vocab_logits.clone()
    nan_logits[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^topic_vocab_logits \(at counted positions\) contains NaN"):
        topic_lm_loss(nan_logits, topic_logits, targets)


def test_topic_lm_loss_reads_the_last_two_axes_whatever_the_rank():
    """(Z, V) is one position; (N, Z, V) is N positions: -log sum_z softmax(prior)_z softmax(logits_z)_x."""

    def by_hand(vocab_logits, prior_logits, target):
        prior = torch.softmax(prior_logits, -1)
        return -math.log(sum(prior[z] * torch.softmax(vocab_logits[z], -1)[target] for z in range(len(prior))))

    vocab_logits, prior_logits = randn(5, 3, 4, seed=26), randn(5, 3, seed=27)
    targets = torch.tensor([0, 3, 2, 1, 3])
    single = topic_lm_loss(vocab_logits[1], prior_logits[1], targets[1])
    assert float(single) == pytest.approx(by_hand(vocab_logits[1], prior_logits[1], 3), rel=1e-12)
    expected = sum(by_hand(vocab_logits[n], prior_logits[n], int(targets[n])) for n in range(5)) / 5
    assert float(topic_lm_loss(vocab_logits, prior_logits, targets)) == pytest.approx(expected, rel=1e-12)


def test_hyperbolic_matching_loss_ranks_texts_per_image_by_default():
    """Texts at radii 0, 1, 2 and images at 0.5, 1.5, 3 on one geodesic: the column terms
    (Eq. 11, the default) and the row terms differ, so the default is told apart."""
    direction = torch.tensor([0.0, 1.0], dtype=DOUBLE)
    text_radii, image_radii = [0.0, 1.0, 2.0], [0.5, 1.5, 3.0]
    texts = lorentz_expmap0(torch.tensor(text_radii, dtype=DOUBLE)[:, None] * direction)
    images = lorentz_expmap0(torch.tensor(image_radii, dtype=DOUBLE)[:, None] * direction)
    square = [[(r - s) ** 2 for s in image_radii] for r in text_radii]  # d^2(w_k, v_j)
    columns = [max(0.0, 1 + square[j][j] - square[k][j]) for j in range(3) for k in range(3) if k != j]
    rows = [max(0.0, 1 + square[i][i] - square[i][other]) for i in range(3) for other in range(3) if other != i]
    assert sum(rows) > 0  # the symmetric loss would add them
    assert float(hyperbolic_matching_loss(texts, images, reduction="sum")) == pytest.approx(sum(columns), rel=1e-12)


def test_distortion_loss_is_exactly_zero_for_coinciding_pairs_and_keeps_float32():
    point = lorentz_expmap0(torch.zeros(1, 2, dtype=DOUBLE))
    zero = torch.zeros(1, 2, dtype=DOUBLE)
    assert float(distortion_loss(point, point, zero, zero)) == 0.0  # d_L = d_E = 0 exactly, not sqrt(tiny)
    texts, images = lorentz_expmap0(randn(3, 2, seed=28)).float(), lorentz_expmap0(randn(3, 2, seed=29)).float()
    assert distortion_loss(texts, images, randn(3, 2, seed=30).float(), randn(3, 2, seed=31).float()).dtype == torch.float32
    # mixed precisions: the terms are taken in the Euclidean embeddings' dtype
    mixed = distortion_loss(texts.double(), images.double(), randn(3, 2, seed=30).float(), randn(3, 2, seed=31).float())
    assert mixed.dtype == torch.float32


def test_topic_lm_loss_with_every_position_counted_copies_no_vocabulary_logits():
    """Every position counted (Chimera's L_T call: the masked positions only): the (M, Z, V)
    logits are read in place (a boolean-index copy and its backward scatter cost ~60% of
    the loss's time at V = 30,522), and the loss and gradient equal the loop's oracle."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    positions, topics, vocab = 5, 3, 11
    vocab_logits = randn(positions, topics, vocab, seed=4).requires_grad_(True)
    topic_logits = randn(positions, topics, seed=5)
    targets = torch.randint(0, vocab, (positions,), generator=torch.Generator().manual_seed(6))
    with Ops() as ops:
        loss = topic_lm_loss(vocab_logits, topic_logits, targets)
        loss.backward()
    copies = [name for name in ops.seen if name.startswith(("index.", "index_put", "_index_put"))]
    assert copies == []
    oracle = sum(
        -math.log(sum(float(torch.softmax(vocab_logits[t, z].detach(), 0)[targets[t]])
                      * float(torch.softmax(topic_logits[t], 0)[z]) for z in range(topics)))
        for t in range(positions)
    ) / positions
    assert math.isclose(float(loss.detach()), oracle, rel_tol=1e-12)
    indexed = vocab_logits.detach().clone().requires_grad_(True)
    topic_lm_loss(indexed, topic_logits, targets, torch.tensor([True, True, False, True, True])).backward()
    assert indexed.grad[2].abs().max() == 0 and indexed.grad[0].abs().max() > 0  # the indexed path still works
