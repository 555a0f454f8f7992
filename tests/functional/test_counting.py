"""The counting component (Zhang, Hare, Prügel-Bennett, ICLR 2018) against its defining
behaviour and a loop-by-loop oracle written from section 3 of the paper."""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.functional.counting import (
    box_iou,
    count_features,
    count_score,
    count_to_one_hot,
    piecewise_linear,
)
from polyfuse.nn.counter import Counter


def _identity_weights(pieces: int = 16) -> torch.Tensor:
    weights = torch.ones(8, pieces + 1, dtype=torch.float64)
    weights[:, 0] = 0.0
    return weights


def _separated_boxes(count: int, total: int) -> torch.Tensor:
    """``total`` unit boxes far apart on a line, (1, total, 4)."""
    boxes = [[3.0 * i, 0.0, 3.0 * i + 1.0, 1.0] for i in range(total)]
    return torch.tensor([boxes], dtype=torch.float64)


def test_piecewise_linear_hand_values():
    weight = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)  # two pieces: 1/4 then 3/4
    x = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    expected = torch.tensor([0.0, 0.125, 0.25, 0.625, 1.0], dtype=torch.float64)
    torch.testing.assert_close(piecewise_linear(x, weight), expected)


def test_box_iou_hand_values():
    boxes = torch.tensor([[[0, 0, 2, 2], [1, 1, 3, 3], [5, 5, 6, 6]]], dtype=torch.float64)
    iou = box_iou(boxes)[0]
    assert iou[0, 1].item() == pytest.approx(1 / 7)  # intersection 1, union 4 + 4 - 1
    assert iou[0, 0].item() == pytest.approx(1.0)
    assert iou[0, 2].item() == 0.0


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_separated_objects_with_attention_one_count_k(count):
    boxes = _separated_boxes(count, 10)
    attention = torch.zeros(1, 10, dtype=torch.float64)
    attention[0, :count] = 1.0
    score, _, _ = count_score(boxes, attention, _identity_weights(), already_sigmoided=True)
    assert score.item() == pytest.approx(count)
    features = count_features(boxes, attention, _identity_weights(), already_sigmoided=True)
    assert features[0].argmax().item() == count


def test_exact_duplicate_boxes_count_once():
    boxes = _separated_boxes(1, 10)
    boxes[0, 1] = boxes[0, 0]  # box 1 is a copy of box 0
    boxes[0, 2] = boxes[0, 0]  # and box 2 too
    attention = torch.zeros(1, 10, dtype=torch.float64)
    attention[0, :3] = 1.0
    score, _, _ = count_score(boxes, attention, _identity_weights(), already_sigmoided=True)
    assert score.item() == pytest.approx(1.0)
    boxes[0, 3] = torch.tensor([30.0, 0.0, 31.0, 1.0], dtype=torch.float64)  # one more object
    attention[0, 3] = 1.0
    score, _, _ = count_score(boxes, attention, _identity_weights(), already_sigmoided=True)
    assert score.item() == pytest.approx(2.0)


def test_one_hot_interpolates():
    one_hot = count_to_one_hot(torch.tensor([[0.0], [2.75], [7.0]]), 3)
    expected = torch.tensor([[1, 0, 0, 0], [0, 0, 0.25, 0.75], [0, 0, 0, 1.0]])
    torch.testing.assert_close(one_hot, expected)


def _oracle(boxes, logits, weights, objects):
    """Section 3 of the paper with explicit loops over boxes (one sample)."""

    def f(k, x):  # f_k, 1-based as in the paper
        w = [abs(v) for v in weights[k - 1].tolist()]
        w = [v / sum(w) for v in w]
        n = len(w) - 1
        y = n * x
        i = min(math.floor(y), n)
        return sum(w[: i + 1]) + (y - math.floor(y)) * w[min(i + 1, n)]

    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
        return w * h / (area(a) + area(b) - w * h + 1e-12)

    order = sorted(range(len(logits)), key=lambda i: -logits[i])[:objects]
    a = [1 / (1 + math.exp(-logits[i])) for i in order]
    b = [boxes[i] for i in order]
    k = len(order)
    D = [[1 - iou(b[i], b[j]) for j in range(k)] for i in range(k)]
    X = [[f(4, a[i] * a[j]) * f(5, D[i][j]) for j in range(k)] for i in range(k)]
    s = []
    for i in range(k):
        row = 0.0
        for j in range(k):
            prod = f(3, 1 - abs(a[i] - a[j]))
            for m in range(k):
                prod *= f(3, 1 - abs(X[m][i] - X[m][j]))
            row += prod
        s.append(row)
    C = sum(f(1, a[i] * a[j]) * f(2, D[i][j]) / (s[i] * s[j]) for i in range(k) for j in range(k))
    C += sum(f(1, a[i] * a[i]) / s[i] for i in range(k))
    c = min(math.sqrt(C), objects)
    one_hot = [0.0] * (objects + 1)
    lo = math.floor(c)
    one_hot[min(lo, objects)] += 1 - (c - lo)
    one_hot[min(lo + 1, objects)] += c - lo
    p_a = sum(abs(f(6, v) - 0.5) for v in a) / k
    p_d = sum(abs(f(7, D[i][j]) - 0.5) for i in range(k) for j in range(k)) / k**2
    return [v * f(8, p_a + p_d) for v in one_hot]


def test_count_features_match_loop_oracle_with_random_functions():
    generator = torch.Generator().manual_seed(3)
    batch, boxes_per_image, objects = 2, 7, 5
    corners = torch.rand(batch, boxes_per_image, 2, generator=generator, dtype=torch.float64)
    sizes = 0.1 + 0.4 * torch.rand(batch, boxes_per_image, 2, generator=generator, dtype=torch.float64)
    boxes = torch.cat([corners, corners + sizes], dim=-1)
    boxes[0, 3] = boxes[0, 1]  # an exact duplicate
    logits = 2 * torch.randn(batch, boxes_per_image, generator=generator, dtype=torch.float64)
    counter = Counter(objects, pieces=4).double()
    with torch.no_grad():
        counter.weight.copy_(torch.rand(8, 5, generator=generator, dtype=torch.float64))
        counter.weight[:, 0] = 0.0
    result = counter(boxes, logits)
    assert result.shape == (batch, objects + 1)
    for sample in range(batch):
        expected = _oracle(boxes[sample].tolist(), logits[sample].tolist(), counter.weight.detach(), objects)
        torch.testing.assert_close(result[sample], torch.tensor(expected, dtype=torch.float64))


def test_counter_gradients_reach_weights_and_attention():
    counter = Counter(4)
    boxes = _separated_boxes(4, 6).float()
    logits = torch.randn(1, 6, requires_grad=True)
    counter(boxes, logits).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert counter.weight.grad is not None and counter.weight.grad.abs().sum() > 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="objects=11"):
        Counter(11)(_separated_boxes(1, 10).float(), torch.zeros(1, 10))
    with pytest.raises(ValueError, match="attention has shape"):
        Counter(2)(_separated_boxes(1, 10).float(), torch.zeros(1, 9))


def test_piecewise_linear_uses_absolute_weights_and_accepts_one_piece():
    # |[0, -1, 3]| normalised: [0, 1/4, 3/4], as test_piecewise_linear_hand_values
    weight = torch.tensor([0.0, -1.0, 3.0], dtype=torch.float64)
    x = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    expected = torch.tensor([0.0, 0.125, 0.25, 0.625, 1.0], dtype=torch.float64)
    torch.testing.assert_close(piecewise_linear(x, weight), expected)
    # n = 1: w = [1/3, 2/3], f(x) = 1/3 + 2/3 x; a value at 0 that is not 0 stays
    one_piece = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(piecewise_linear(x, one_piece), 1 / 3 + 2 / 3 * x)
    for bad in (torch.ones(1), torch.ones(2, 3)):
        with pytest.raises(ValueError, match=r"^piecewise_linear: weight must have shape \(n \+ 1,\), n >= 1, got \("):
            piecewise_linear(x, bad)


def test_box_iou_of_inverted_and_empty_boxes_is_zero():
    boxes = torch.tensor(
        [[[0, 0, 2, 2], [2, 2, 0, 0], [1, 1, 1, 1], [-1, -1, 3, 3]]], dtype=torch.float64
    )  # box 1 is inverted (area 0, not 4), box 2 empty, box 3 contains box 0
    iou = box_iou(boxes)[0]
    assert iou[0, 1].item() == 0.0 and iou[1, 1].item() == 0.0 and iou[2, 2].item() == 0.0
    assert iou[0, 3].item() == pytest.approx(4 / 16)
    assert iou[3, 0].item() == pytest.approx(4 / 16)
    with pytest.raises(ValueError, match=r"^box_iou: boxes must have shape \(B, M, 4\), got \(4, 4\)$"):
        box_iou(boxes[0])
    with pytest.raises(ValueError, match=r"^box_iou: boxes must have shape \(B, M, 4\), got \(1, 4, 3\)$"):
        box_iou(boxes[..., :3])


def test_one_hot_clamps_negative_counts_and_keeps_the_dtype():
    one_hot = count_to_one_hot(torch.tensor([[-0.5], [3.0], [1.5]], dtype=torch.float64), 3)
    expected = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 1.0], [0, 0.5, 0.5, 0]], dtype=torch.float64)
    torch.testing.assert_close(one_hot, expected)


def test_count_features_checks_name_the_argument():
    boxes = _separated_boxes(3, 6)
    attention = torch.zeros(1, 6, dtype=torch.float64)
    weights = _identity_weights(4)
    owner = "^count_features: "
    with pytest.raises(ValueError, match=owner + r"boxes must have shape \(B, M, 4\), got \(6, 4\)$"):
        count_features(boxes[0], attention, weights, objects=3)
    with pytest.raises(ValueError, match=owner + r"boxes must have shape \(B, M, 4\), got \(1, 6, 3\)$"):
        count_features(boxes[..., :3], attention, weights, objects=3)
    with pytest.raises(ValueError, match=owner + r"attention has shape \(1, 5\), but boxes give \(B, M\) = \(1, 6\)$"):
        count_features(boxes, attention[:, :5], weights, objects=3)
    for bad in (weights[:7], weights[:, :1], weights[0]):
        with pytest.raises(ValueError, match=owner + r"weights must have shape \(8, n \+ 1\), got "):
            count_features(boxes, attention, bad, objects=3)
    for objects in (0, 7):
        with pytest.raises(ValueError, match=owner + f"objects={objects} must lie in \\[1, M\\] with M = 6 boxes given$"):
            count_features(boxes, attention, weights, objects=objects)


def test_count_of_one_kept_box_two_pieces_and_extra_weight_rows():
    """objects = 1 and objects = M are accepted; weights of one piece (f_k(x) = x) and a
    ninth row, which is ignored, count k separated boxes with attention 1 as k."""
    boxes = _separated_boxes(2, 4)
    attention = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    weights = torch.cat([_identity_weights(1), torch.full((1, 2), 7.0, dtype=torch.float64)])
    score, kept, distance = count_score(boxes, attention, weights, objects=4, already_sigmoided=True)
    assert score.item() == pytest.approx(2.0)
    assert sorted(kept[0].tolist()) == [0.0, 0.0, 1.0, 1.0]
    assert distance.shape == (1, 4, 4)
    one, kept, _ = count_score(boxes, attention, weights, objects=1, already_sigmoided=True)
    assert one.item() == pytest.approx(1.0) and kept.tolist() == [[1.0]]
    # logits: sigmoid(0) = 1/2 for one box; C = f_1(a a) = 1/4, c = 1/2
    half, kept, _ = count_score(boxes, torch.zeros(1, 4, dtype=torch.float64), weights, objects=1)
    assert half.item() == pytest.approx(0.5) and kept.tolist() == [[0.5]]


def test_counter_module_defaults_repr_and_checks():
    counter = Counter()
    assert counter.objects == 10 and counter.pieces == 16 and not counter.already_sigmoided
    expected = torch.ones(8, 17)
    expected[:, 0] = 0.0
    torch.testing.assert_close(counter.weight.detach(), expected)
    assert counter.extra_repr() == "objects=10, pieces=16, already_sigmoided=False"
    sigmoided = Counter(2, pieces=3, already_sigmoided=1)
    assert sigmoided.extra_repr() == "objects=2, pieces=3, already_sigmoided=True"
    boxes = _separated_boxes(2, 3).float()
    attention = torch.tensor([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(sigmoided(boxes, attention), count_features(boxes, attention, sigmoided.weight, objects=2, already_sigmoided=True))
    assert sigmoided(boxes, attention)[0].argmax().item() == 2  # two boxes counted
    for args, name, value in [((0,), "objects", "0"), ((True,), "objects", "True"), ((2.0,), "objects", "2.0"), ((3, 0), "pieces", "0")]:
        options = {"pieces": args[1]} if len(args) > 1 else {}
        with pytest.raises(ValueError, match=f"^Counter: {name} must be a positive integer, got {value}$"):
            Counter(args[0], **options)


def test_counter_accepts_one_object_and_one_piece():
    # objects = 1 and pieces = 1 are positive integers: accepted, and the counts still
    # follow the loop oracle (one piece: each f_k is linear between its two weights).
    generator = torch.Generator().manual_seed(5)
    corners = torch.rand(1, 3, 2, generator=generator, dtype=torch.float64)
    boxes = torch.cat([corners, corners + 0.3], dim=-1)
    logits = torch.randn(1, 3, generator=generator, dtype=torch.float64)
    counter = Counter(1, pieces=1).double()
    with torch.no_grad():
        counter.weight.copy_(torch.rand(8, 2, generator=generator, dtype=torch.float64))
        counter.weight[:, 0] = 0.0
    result = counter(boxes, logits)
    expected = _oracle(boxes[0].tolist(), logits[0].tolist(), counter.weight.detach(), 1)
    torch.testing.assert_close(result[0], torch.tensor(expected, dtype=torch.float64))


def test_box_iou_adds_the_authors_epsilon_to_the_union():
    """A box of area 1e-12 with itself: IoU = 1e-12 / (1e-12 + 1e-12) = 1/2, the authors'
    ``intersection / (union + 1e-12)``; two empty boxes give 0, not NaN."""
    boxes = torch.tensor([[[0.0, 0.0, 1e-6, 1e-6], [5.0, 5.0, 5.0, 5.0]]], dtype=torch.float64)
    iou = box_iou(boxes)[0]
    assert iou[0, 0].item() == pytest.approx(0.5, rel=1e-9)
    assert iou[1, 1].item() == 0.0 and iou[0, 1].item() == 0.0


def test_count_features_take_logits_by_default():
    """Without ``already_sigmoided`` the attention is the sigmoid of the logits (the loop
    oracle applies it), and the flag set to True gives the features of the raw values."""
    generator = torch.Generator().manual_seed(5)
    corners = torch.rand(1, 6, 2, generator=generator, dtype=torch.float64)
    boxes = torch.cat([corners, corners + 0.3], dim=-1)
    logits = torch.randn(1, 6, generator=generator, dtype=torch.float64)
    weights = torch.rand(8, 4, generator=generator, dtype=torch.float64)
    expected = _oracle(boxes[0].tolist(), logits[0].tolist(), weights, 4)
    torch.testing.assert_close(count_features(boxes, logits, weights, objects=4)[0], torch.tensor(expected, dtype=torch.float64))
    raw = count_features(boxes, torch.sigmoid(logits), weights, objects=4, already_sigmoided=True)
    torch.testing.assert_close(raw[0], torch.tensor(expected, dtype=torch.float64))


def test_one_hot_clamps_infinite_and_huge_counts_to_k():
    """Counts are clamped to [0, K] before the floor: +inf and 1e30 (whose floor does not
    fit an integer) put all the mass on K."""
    one_hot = count_to_one_hot(torch.tensor([[math.inf], [1e30], [3.5]], dtype=torch.float64), 3)
    expected = torch.tensor([[0, 0, 0, 1.0]] * 3, dtype=torch.float64)
    torch.testing.assert_close(one_hot, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_one_hot_keeps_the_dtype_and_device_of_the_count(dtype):
    """The rows are made in the count's dtype (a half-precision count is not promoted to
    float32) and on its device (a meta count gives a meta result)."""
    one_hot = count_to_one_hot(torch.tensor([[1.5], [0.0]], dtype=dtype), 2)
    assert one_hot.dtype == dtype
    torch.testing.assert_close(one_hot, torch.tensor([[0, 0.5, 0.5], [1, 0, 0]], dtype=dtype))
    on_meta = count_to_one_hot(torch.zeros(2, 1, dtype=dtype, device="meta"), 2)
    assert on_meta.device.type == "meta" and on_meta.shape == (2, 3) and on_meta.dtype == dtype


def test_no_attention_counts_zero_through_the_authors_epsilon():
    # Attention 0 everywhere: C = 0, and the count is sqrt(0 + 1e-20) = 1e-10, not NaN.
    boxes = _separated_boxes(3, 10)
    attention = torch.zeros(1, 10, dtype=torch.float64)
    score, _, _ = count_score(boxes, attention, _identity_weights(), already_sigmoided=True)
    assert score.item() == pytest.approx(1e-10, rel=1e-12)
