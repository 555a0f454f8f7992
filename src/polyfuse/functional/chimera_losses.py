"""Chimera's training objectives (Chimera Eq. 3 and 10 to 13).

Shapes: ``B`` batch (pairs of a text and an image, row b of each input belongs to
pair b), ``...`` token positions, ``Z`` topics, ``V`` vocabulary size, ``D`` size of
a topic representation, ``n`` hyperbolic dimension (points have n + 1 coordinates),
``d`` size of a Euclidean embedding.

In a batch, pair (b, b) is the observed (positive) pair of Eq. 10 to 12 and every
(k, j) with k != j is a negative: N = B - 1 in-batch negatives, as in the paper's
fine-tuning (N set to the batch size, following CLIP).

Under ``torch.autocast`` every objective computes in float32 (autocast off, float32
returned): log-softmax, logsumexp and the hyperbolic distances must not run in bfloat16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyfuse._checks import check_finite, check_float_tensor, check_hyperboloid_points
from polyfuse._precision import float32_under_autocast
from polyfuse.functional.lorentz import lorentz_distance

__all__ = [
    "chimera_objective",
    "distortion_loss",
    "hyperbolic_matching_loss",
    "topic_lm_loss",
    "topic_matching_loss",
]

_REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _reduce(terms: Tensor, reduction: str) -> Tensor:
    return terms.mean() if reduction == "mean" else terms.sum()


def _check_pairs(text: Tensor, image: Tensor, text_name: str, image_name: str) -> None:
    """(B, ...) tensors of one pair per row: same batch size and feature size."""
    if text.dim() != 2 or image.dim() != 2:
        raise ValueError(
            f"{text_name} and {image_name} must be (B, size) tensors, got "
            f"{tuple(text.shape)} and {tuple(image.shape)}"
        )
    if text.shape != image.shape:
        raise ValueError(
            f"{text_name} {tuple(text.shape)} and {image_name} {tuple(image.shape)} must have "
            "the same shape (one pair per row)"
        )


@float32_under_autocast
def topic_lm_loss(
    topic_vocab_logits: Tensor,
    topic_logits: Tensor,
    targets: Tensor,
    mask: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Topic-marginalised masked-token likelihood L_T (Chimera Eq. 3).

        L_T = - sum_t log sum_z P(x_t | x_\\t, z_t = z) P(z_t = z | x_\\t)

    P(z | x_\\t) is the topic prior of Eq. 4 (softmax of ``topic_logits``, i.e. of
    LayerNorm(H_L) W_Z) and P(x_t | x_\\t, z) the word distribution of topic z (softmax
    of ``topic_vocab_logits``: the vocabulary head W_{V|Z} applied to topic z's state,
    Eq. 5; see ``TopicLayer.topic_states``). The sum over z runs in log space.

    Args:
        topic_vocab_logits: (..., Z, V) word logits per topic.
        topic_logits: (..., Z) topic prior logits.
        targets: (...) int64 token ids; positions equal to ``ignore_index`` are skipped
            (the Hugging Face convention for unmasked tokens).
        mask: optional (...) bool, True = a position that counts (e.g. a masked token);
            combined with ``ignore_index``.
        ignore_index: target value marking positions that do not count.
        reduction: ``"mean"`` over the counted positions (default) or ``"sum"`` (Eq. 3
            as printed). No counted position gives 0.

    Returns:
        Scalar loss.
    """
    _check_reduction(reduction)
    check_float_tensor(topic_vocab_logits, "topic_vocab_logits", min_dim=2)
    check_float_tensor(topic_logits, "topic_logits")
    if not isinstance(targets, Tensor) or targets.dtype != torch.long:
        raise ValueError("targets must be an int64 tensor of token ids")
    position_shape = topic_vocab_logits.shape[:-2]
    num_topics, vocab_size = topic_vocab_logits.shape[-2:]
    if topic_logits.shape != (*position_shape, num_topics):
        raise ValueError(
            f"topic_logits has shape {tuple(topic_logits.shape)}, expected "
            f"{(*position_shape, num_topics)} for topic_vocab_logits {tuple(topic_vocab_logits.shape)}"
        )
    if targets.shape != position_shape:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, expected {tuple(position_shape)}"
        )
    counted = targets != ignore_index
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != position_shape:
            raise ValueError(
                f"mask must be a bool tensor of shape {tuple(position_shape)} (True = counts)"
            )
        counted = counted & mask
    if bool(counted.all()):  # then no (M, Z, V) copy by boolean indexing (nor its backward)
        topic_vocab_logits = topic_vocab_logits.reshape(-1, num_topics, vocab_size)
        topic_logits, chosen = topic_logits.reshape(-1, num_topics), targets.reshape(-1)
    else:
        topic_vocab_logits, topic_logits, chosen = topic_vocab_logits[counted], topic_logits[counted], targets[counted]
    check_finite(topic_vocab_logits, "topic_vocab_logits (at counted positions)")
    check_finite(topic_logits, "topic_logits (at counted positions)")
    if bool(((chosen < 0) | (chosen >= vocab_size)).any()):
        raise ValueError(f"targets must lie in [0, {vocab_size}) at counted positions")
    if chosen.numel() == 0:
        return topic_vocab_logits.sum() * 0.0

    word_log_probs = torch.log_softmax(topic_vocab_logits, dim=-1)  # (M, Z, V)
    index = chosen.view(-1, 1, 1).expand(-1, num_topics, 1)
    target_log_probs = word_log_probs.gather(-1, index).squeeze(-1)  # log P(x_t | z), (M, Z)
    prior_log_probs = torch.log_softmax(topic_logits, dim=-1)  # log P(z), (M, Z)
    log_likelihood = torch.logsumexp(target_log_probs + prior_log_probs, dim=-1)  # Eq. 3
    return _reduce(-log_likelihood, reduction)


@float32_under_autocast
def topic_matching_loss(
    text_topics: Tensor,
    image_topics: Tensor,
    *,
    temperature: float = 1.0,
    symmetric: bool = False,
) -> Tensor:
    """Topic level matching L_TLM: InfoNCE with in-batch negatives (Chimera Eq. 10).

        L_TLM = - mean_b log exp phi(t_b, i_b) / (exp phi(t_b, i_b) + sum_{n != b} exp phi(t_b, i_n))

    with phi(t, i) = <t, i> / temperature, the inner product of the paper at
    temperature 1 (a CLIP-style temperature is offered because inner products of
    topic distributions lie in [0, 1]). Each text is contrasted with the B - 1 other
    images of the batch; ``symmetric`` averages with the image-to-text direction.

    Args:
        text_topics: (B, D) topic representation of each text (in Chimera, the mean
            topic distribution over its real tokens).
        image_topics: (B, D) topic representation of each image; row b is text b's pair.
        temperature: positive divisor of the inner products.
        symmetric: also contrast each image with the other texts, and average.

    Returns:
        Scalar loss.
    """
    check_float_tensor(text_topics, "text_topics")
    check_float_tensor(image_topics, "image_topics")
    _check_pairs(text_topics, image_topics, "text_topics", "image_topics")
    if text_topics.shape[0] < 2:
        raise ValueError("topic_matching_loss needs a batch of at least 2 pairs (in-batch negatives)")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    check_finite(text_topics, "text_topics")
    check_finite(image_topics, "image_topics")
    scores = text_topics @ image_topics.T / temperature  # phi(t_b, i_c), (B, B)
    positives = scores.diagonal()
    text_to_image = (torch.logsumexp(scores, dim=1) - positives).mean()  # Eq. 10
    if not symmetric:
        return text_to_image
    image_to_text = (torch.logsumexp(scores, dim=0) - positives).mean()
    return 0.5 * (text_to_image + image_to_text)


def _pair_distances(text_points: Tensor, image_points: Tensor) -> Tensor:
    """(B, B) matrix of d_L(text_k, image_j), exact on the diagonal."""
    return lorentz_distance(text_points.unsqueeze(1), image_points.unsqueeze(0))


@float32_under_autocast
def hyperbolic_matching_loss(
    text_points: Tensor,
    image_points: Tensor,
    *,
    margin: float = 1.0,
    symmetric: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """Hyperbolic level matching L_HLM: hinge on squared Lorentz distances (Chimera Eq. 11).

        L_HLM = sum_j sum_{k != j} [m + d_L^2(w_j, v_j) - d_L^2(w_k, v_j)]_+

    For every image v_j, each other text w_k of the batch must be farther (in squared
    distance) than its own text w_j by the margin m. ``symmetric`` adds the other
    direction (each text against the other images), the bi-directional ranking loss
    the paper's text mentions. The paper does not give m.

    Args:
        text_points: (B, n + 1) hyperboloid points of the texts (w~ of Eq. 11).
        image_points: (B, n + 1) hyperboloid points of the images; row b pairs with text b.
        margin: the safety margin m > 0.
        symmetric: also rank images for each text.
        reduction: ``"mean"`` over the B (B - 1) hinge terms per direction (default) or
            ``"sum"`` (Eq. 11 as printed).

    Returns:
        Scalar loss.
    """
    _check_reduction(reduction)
    check_hyperboloid_points(text_points, "text_points")
    check_hyperboloid_points(image_points, "image_points")
    _check_pairs(text_points, image_points, "text_points", "image_points")
    batch = text_points.shape[0]
    if batch < 2:
        raise ValueError("hyperbolic_matching_loss needs a batch of at least 2 pairs (negatives)")
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    squared = _pair_distances(text_points, image_points).pow(2)  # d_L^2(w_k, v_j), (B, B)
    positives = squared.diagonal()
    negative = ~torch.eye(batch, dtype=torch.bool, device=squared.device)
    # column j: image j against every text k; Eq. 11
    terms = torch.relu(margin + positives.unsqueeze(0) - squared)[negative]
    if symmetric:  # row i: text i against every image l
        terms = torch.cat((terms, torch.relu(margin + positives.unsqueeze(1) - squared)[negative]))
    return _reduce(terms, reduction)


@float32_under_autocast
def distortion_loss(
    text_points: Tensor,
    image_points: Tensor,
    text_embeddings: Tensor,
    image_embeddings: Tensor,
    *,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """Distortion L_D between Lorentz and Euclidean distances of the same pairs (Chimera Eq. 12).

        L_D = sum_{(k, j)} |d_L(w~_k, v~_j) - d_E(w_k, v^_j)| / d_E(w_k, v^_j)

    over the positive pairs (k = j) and the negative pairs (k != j) alike, i.e. over
    all B^2 pairs; the [.]_+ of the paper acts on a non-negative number and is the
    identity. d_E is floored at ``eps`` in the denominator.

    Args:
        text_points: (B, n + 1) hyperboloid points w~ of the texts.
        image_points: (B, n + 1) hyperboloid points v~ of the images.
        text_embeddings: (B, d) Euclidean embeddings w of the texts (in Chimera, the
            vectors whose exponential maps are ``text_points``).
        image_embeddings: (B, d) Euclidean embeddings v^ of the images.
        eps: floor of the Euclidean distance in the denominator.
        reduction: ``"mean"`` over the B^2 pairs (default) or ``"sum"`` (Eq. 12 as printed).

    Returns:
        Scalar loss.
    """
    _check_reduction(reduction)
    check_hyperboloid_points(text_points, "text_points")
    check_hyperboloid_points(image_points, "image_points")
    _check_pairs(text_points, image_points, "text_points", "image_points")
    check_float_tensor(text_embeddings, "text_embeddings")
    check_float_tensor(image_embeddings, "image_embeddings")
    _check_pairs(text_embeddings, image_embeddings, "text_embeddings", "image_embeddings")
    if text_embeddings.shape[0] != text_points.shape[0]:
        raise ValueError(
            f"text_embeddings has {text_embeddings.shape[0]} rows but text_points has "
            f"{text_points.shape[0]}"
        )
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    check_finite(text_embeddings, "text_embeddings")
    check_finite(image_embeddings, "image_embeddings")
    lorentz = _pair_distances(text_points, image_points)
    difference = text_embeddings.unsqueeze(1) - image_embeddings.unsqueeze(0)
    squared = difference.pow(2).sum(-1)
    # Euclidean distance with a zero (not NaN) gradient at coinciding embeddings
    euclidean = torch.sqrt(squared.clamp_min(torch.finfo(squared.dtype).tiny))
    euclidean = torch.where(squared > 0, euclidean, 0.0)
    terms = (lorentz.to(euclidean.dtype) - euclidean).abs() / euclidean.clamp_min(eps)  # Eq. 12
    return _reduce(terms, reduction)


@float32_under_autocast
def chimera_objective(
    *,
    topic_lm: Tensor | None = None,
    topic_matching: Tensor | None = None,
    hyperbolic_matching: Tensor | None = None,
    distortion: Tensor | None = None,
    model_loss: Tensor | None = None,
    topic_lm_weight: float = 0.5,
    topic_matching_weight: float = 0.5,
    hyperbolic_matching_weight: float = 0.5,
    distortion_weight: float = 0.5,
    model_loss_weight: float = 1.0,
) -> Tensor:
    """Chimera's multi-task objective (Chimera Eq. 13).

        L = lambda_T L_T + lambda_TLM L_TLM + lambda_HLM L_HLM + lambda_D L_D + lambda_O L_O

    with the paper's weights 0.5, 0.5, 0.5, 0.5 and 1.0 (section 4.2) as defaults.
    Terms passed as None are left out (the ablations of Table 4).

    Args:
        topic_lm: L_T (:func:`topic_lm_loss`), scalar.
        topic_matching: L_TLM (:func:`topic_matching_loss`), scalar.
        hyperbolic_matching: L_HLM (:func:`hyperbolic_matching_loss`), scalar.
        distortion: L_D (:func:`distortion_loss`), scalar.
        model_loss: L_O, the pre-trained model's own objective, scalar.
        topic_lm_weight, topic_matching_weight, hyperbolic_matching_weight,
        distortion_weight, model_loss_weight: the lambdas, finite and >= 0.

    Returns:
        Scalar total loss.
    """
    terms = {
        "topic_lm": (topic_lm, topic_lm_weight),
        "topic_matching": (topic_matching, topic_matching_weight),
        "hyperbolic_matching": (hyperbolic_matching, hyperbolic_matching_weight),
        "distortion": (distortion, distortion_weight),
        "model_loss": (model_loss, model_loss_weight),
    }
    total = None
    for name, (loss, weight) in terms.items():
        weight = float(weight)
        if not (weight >= 0 and weight != float("inf")):
            raise ValueError(f"{name}_weight must be finite and non-negative, got {weight}")
        if loss is None:
            continue
        if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            raise ValueError(f"{name} must be a scalar float tensor")
        check_finite(loss, name)
        weighted = weight * loss.reshape(())  # Eq. 13
        total = weighted if total is None else total + weighted
    if total is None:
        raise ValueError("chimera_objective needs at least one loss term")
    return total
