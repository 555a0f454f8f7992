"""Lorentz geometry and Chimera's hyperbolic attention against geoopt, closed forms of
hyperbolic geometry, and brute-force loops."""

import math

import pytest
import torch

from polyfuse.functional.lorentz import (
    clip_radius,
    einstein_midpoint,
    klein_to_lorentz,
    lorentz_attention,
    lorentz_distance,
    lorentz_expmap0,
    lorentz_factor,
    lorentz_inner,
    lorentz_logmap0,
    lorentz_pairwise_distance,
    lorentz_project,
    lorentz_to_klein,
)

# imported after polyfuse, which silences geoopt's torch.jit deprecation warnings
geoopt = pytest.importorskip("geoopt")
geoopt_math = geoopt.manifolds.lorentz.math

DOUBLE = torch.float64
EXTREME_NORMS = [1e-6, 1e-4, 1e-2, 1.0, 3.0, 10.0, 30.0, 50.0]
UNIT = torch.tensor(1.0, dtype=DOUBLE)


def random_directions(count, dim, seed=0, dtype=DOUBLE):
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(count, dim, generator=generator, dtype=DOUBLE)
    return (directions / directions.norm(dim=-1, keepdim=True)).to(dtype)


def random_points(*shape, scale=1.0, seed=0):
    """Hyperboloid points (float64) from random tangent vectors of shape ``shape``."""
    generator = torch.Generator().manual_seed(seed)
    return lorentz_expmap0(torch.randn(*shape, generator=generator, dtype=DOUBLE) * scale)


def minkowski_residual(points):
    """<x, x>_L + 1 in float64, the hyperboloid equation's error."""
    points = points.detach().to(DOUBLE)
    return geoopt_math.inner(points, points) + 1.0


# ----------------------------------------------------------------------- conventions


def test_geoopt_conventions_match_note_10():
    manifold = geoopt.Lorentz(k=1.0)
    origin = manifold.origin(4, dtype=DOUBLE)
    assert torch.equal(origin, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=DOUBLE))
    x, y = random_points(2, 3, seed=1)
    by_hand = (x[1:] * y[1:]).sum() - x[0] * y[0]  # note 10's <x, y>_L
    assert torch.allclose(lorentz_inner(x, y), by_hand, rtol=1e-12)
    assert torch.allclose(manifold.inner(None, x, y), by_hand, rtol=1e-12)
    assert torch.allclose(manifold.dist(x, y), torch.acosh(-by_hand), rtol=1e-10)
    # curvature -1: the point exp_0(v) lies at distance |v| from the origin
    v = torch.tensor([0.3, -1.2, 0.5], dtype=DOUBLE)
    assert torch.allclose(manifold.dist(origin, lorentz_expmap0(v)), v.norm(), rtol=1e-10)
    assert torch.allclose(lorentz_distance(origin, lorentz_expmap0(v)), v.norm(), rtol=1e-12)


# ---------------------------------------------------------------- exponential map


@pytest.mark.parametrize("norm", EXTREME_NORMS)
def test_expmap0_lies_on_the_hyperboloid_in_float32(norm):
    tangent = random_directions(16, 8, seed=int(norm * 1e6) % 1000, dtype=torch.float32) * norm
    points = lorentz_expmap0(tangent)
    assert points.dtype == torch.float32 and torch.isfinite(points).all()
    assert (points[:, 0] >= 1).all()
    time = points[:, 0].to(DOUBLE)
    residual = minkowski_residual(points).abs()
    # relative to the size of the terms, x_0^2 (module docstring); the absolute bound
    # wherever float32 can hold it (x_0 ~ 1)
    assert (residual <= 1e-5 * time.pow(2)).all(), residual.max()
    if norm <= 2.0:
        assert (residual <= 1e-5).all(), residual.max()
    # and the point sits at the intended radius
    assert torch.allclose(lorentz_logmap0(points), tangent, rtol=1e-5, atol=1e-12)


def test_expmap0_matches_geoopt():
    tangent = random_directions(10, 5, seed=2) * torch.logspace(-3, math.log10(5.0), 10, dtype=DOUBLE)[:, None]
    ours = lorentz_expmap0(tangent)
    padded = torch.cat((torch.zeros(10, 1, dtype=DOUBLE), tangent), dim=-1)  # (0, v) at the origin
    assert torch.allclose(ours, geoopt_math.expmap0(padded, k=UNIT), rtol=1e-12, atol=1e-15)
    assert torch.allclose(ours, geoopt.Lorentz(k=1.0).expmap0(padded), rtol=1e-12, atol=1e-15)
    radius = tangent.norm(dim=-1, keepdim=True)
    polar = torch.cat((tangent / radius, radius), dim=-1)
    assert torch.allclose(ours, geoopt_math.project_polar(polar, k=UNIT), rtol=1e-14)


def test_expmap0_at_zero_is_the_origin_with_the_true_jacobian():
    zero = torch.zeros(3, dtype=DOUBLE)
    assert torch.equal(lorentz_expmap0(zero), torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=DOUBLE))
    jacobian = torch.autograd.functional.jacobian(lorentz_expmap0, zero)
    expected = torch.cat((torch.zeros(1, 3, dtype=DOUBLE), torch.eye(3, dtype=DOUBLE)))
    assert torch.allclose(jacobian, expected)


def test_expmap0_caps_the_radius_and_keeps_the_direction():
    direction = random_directions(4, 6, seed=3)
    tangent = direction * torch.tensor([0.5, 2.0, 7.0, 300.0], dtype=DOUBLE)[:, None]
    points = lorentz_expmap0(tangent, max_radius=3.0)
    radius = lorentz_distance(points, lorentz_expmap0(torch.zeros(6, dtype=DOUBLE)))
    assert torch.allclose(radius, torch.tensor([0.5, 2.0, 3.0, 3.0], dtype=DOUBLE), rtol=1e-12)
    recovered = lorentz_logmap0(points)
    assert torch.allclose(recovered / recovered.norm(dim=-1, keepdim=True), direction)
    # without a cap, float32 still stays finite far beyond cosh's overflow at 89
    huge = lorentz_expmap0(direction.float() * 500.0)
    assert torch.isfinite(huge).all()
    assert torch.allclose(clip_radius(tangent, 3.0).norm(dim=-1), radius)


# ------------------------------------------------------------------------ distances


def extreme_points(dtype=torch.float32, seed=4):
    norms = torch.tensor([0.0, *EXTREME_NORMS], dtype=DOUBLE)
    tangent = (random_directions(len(norms), 6, seed=seed) * norms[:, None]).to(dtype)
    return tangent.requires_grad_()


def test_distances_at_the_extremes_are_a_metric_with_finite_gradients():
    tangent = extreme_points()
    points = lorentz_expmap0(tangent)
    distances = lorentz_distance(points.unsqueeze(1), points.unsqueeze(0))
    assert distances.dtype == torch.float32
    assert torch.isfinite(distances).all()
    assert torch.equal(distances, distances.T)  # exactly symmetric
    assert (distances >= 0).all()
    assert torch.equal(distances.diagonal(), torch.zeros(len(points)))
    # far pairs stay accurate: the distance to the origin is the radius, even at 50
    radius = tangent.detach().to(DOUBLE).norm(dim=-1)
    assert torch.allclose(distances[0].to(DOUBLE), radius, rtol=1e-5, atol=1e-9)
    (gradient,) = torch.autograd.grad(distances.sum(), tangent)
    assert torch.isfinite(gradient).all()
    # the memory-light pairwise form: finite, symmetric, non-negative too
    points = lorentz_expmap0(tangent)
    pairwise = lorentz_pairwise_distance(points, points)
    assert torch.isfinite(pairwise).all() and (pairwise >= 0).all()
    assert torch.allclose(pairwise, pairwise.T)
    (gradient,) = torch.autograd.grad(pairwise.sum(), tangent)
    assert torch.isfinite(gradient).all()


def test_distances_match_geoopt_and_each_other():
    x = random_points(7, 4, scale=1.5, seed=5)
    y = random_points(5, 4, scale=1.5, seed=6)
    reference = geoopt_math.dist(x.unsqueeze(1), y.unsqueeze(0), k=UNIT)
    assert torch.allclose(lorentz_distance(x.unsqueeze(1), y.unsqueeze(0)), reference, rtol=1e-9)
    assert torch.allclose(lorentz_pairwise_distance(x, y), reference, rtol=1e-9)
    assert torch.allclose(geoopt.Lorentz(k=1.0).dist(x[0], y[0]), lorentz_distance(x[0], y[0]))
    keep = lorentz_distance(x[0], y[0], keepdim=True)
    assert keep.shape == (1,)


def test_distances_along_a_ray_are_differences_of_radii():
    # where geoopt's arcosh(-<x,y>) cancels (float64, radii 30 and 31) we stay exact
    direction = random_directions(1, 3, seed=7)[0]
    radii = torch.tensor([0.0, 1e-7, 0.5, 30.0, 31.0], dtype=DOUBLE)
    points = lorentz_expmap0(direction * radii[:, None])
    distances = lorentz_distance(points.unsqueeze(1), points.unsqueeze(0))
    expected = (radii[:, None] - radii[None, :]).abs()
    # float64 coordinates of size sinh(31) = 1.5e13 leave the last pair ~1e-6 of slack
    assert torch.allclose(distances, expected, rtol=1e-6, atol=1e-14)
    assert torch.allclose(distances[:3, :3], expected[:3, :3], rtol=1e-12, atol=1e-20)
    geoopt_distance = geoopt_math.dist(points[3], points[4], k=UNIT)
    assert not torch.isclose(geoopt_distance, expected[3, 4], rtol=0.1)  # 24 instead of 1


def test_distance_gradient_at_the_origin_points_away_from_the_other_point():
    target = random_points(3, scale=2.0, seed=8)
    zero = torch.zeros(3, dtype=DOUBLE, requires_grad=True)
    for distance in (
        lorentz_distance(lorentz_expmap0(zero), target),
        lorentz_pairwise_distance(lorentz_expmap0(zero)[None], target[None])[0, 0],
    ):
        (gradient,) = torch.autograd.grad(distance, zero)
        toward = lorentz_logmap0(target)
        assert torch.allclose(gradient, -toward / toward.norm(), atol=1e-7)


# ------------------------------------------------------------- log map, projection


def test_logmap0_inverts_expmap0_and_matches_geoopt():
    points = random_points(6, 4, scale=2.0, seed=9)
    ours = lorentz_logmap0(points)
    assert torch.allclose(ours, geoopt_math.logmap0(points, k=UNIT)[..., 1:], rtol=1e-9)
    assert torch.allclose(lorentz_expmap0(ours), points, rtol=1e-12)
    # float32, radius 1e-5: x_0 rounds to 1, geoopt's arcosh(x_0) loses the radius
    tangent = torch.tensor([1e-5, 0.0], dtype=torch.float32)
    small = lorentz_expmap0(tangent)
    assert torch.allclose(lorentz_logmap0(small), tangent, rtol=1e-6)
    geoopt_radius = geoopt_math.logmap0(small, k=torch.tensor(1.0))[1:].norm()
    assert not torch.isclose(geoopt_radius, torch.tensor(1e-5), rtol=0.1)


def test_project_matches_geoopt_and_survives_float32_overflow():
    generator = torch.Generator().manual_seed(10)
    ambient = torch.randn(5, 4, generator=generator, dtype=DOUBLE)
    ours = lorentz_project(ambient)
    assert torch.allclose(ours, geoopt_math.project(ambient, k=UNIT))
    assert torch.allclose(minkowski_residual(ours), torch.zeros(5, dtype=DOUBLE), atol=1e-12)
    far = torch.tensor([0.0, 1e20, 0.0], dtype=torch.float32)
    assert torch.isinf(geoopt_math.project(far, k=torch.tensor(1.0))[0])
    assert torch.isclose(lorentz_project(far)[0], torch.tensor(1e20))


# ----------------------------------------------------------------------- Klein model


def test_klein_maps_and_the_lorentz_factor():
    points = random_points(8, 3, scale=2.0, seed=11)
    klein = lorentz_to_klein(points)
    assert (klein.norm(dim=-1) < 1).all()
    assert torch.allclose(klein_to_lorentz(klein), points, rtol=1e-10)
    assert torch.allclose(lorentz_factor(klein), points[:, 0], rtol=1e-10)  # gamma = x_0
    assert torch.equal(lorentz_factor(torch.zeros(2, 3, dtype=DOUBLE)), torch.ones(2, dtype=DOUBLE))
    # Klein radius is tanh of the hyperbolic radius
    radius = lorentz_logmap0(points).norm(dim=-1)
    assert torch.allclose(klein.norm(dim=-1), torch.tanh(radius))


# ------------------------------------------------------------------ Einstein midpoint


def test_einstein_midpoint_of_identical_points_is_that_point():
    point = lorentz_to_klein(random_points(4, scale=1.5, seed=12))
    points = point.expand(5, 4)
    weights = torch.tensor([0.1, 2.0, 0.3, 0.0, 5.0], dtype=DOUBLE)
    assert torch.allclose(einstein_midpoint(points, weights), point, rtol=1e-12)


def test_einstein_midpoint_with_one_nonzero_weight_returns_that_point():
    points = lorentz_to_klein(random_points(2, 6, 3, seed=13))
    weights = torch.zeros(2, 4, 6, dtype=DOUBLE)  # (B, Q, N): query q picks point q
    for q in range(4):
        weights[:, q, q] = 0.7
    midpoints = einstein_midpoint(points, weights)
    assert midpoints.shape == (2, 4, 3)
    assert torch.allclose(midpoints, points[:, :4], rtol=1e-12)


def test_einstein_midpoint_of_two_points_is_the_geodesic_midpoint():
    a, b = random_points(2, 3, scale=2.0, seed=14)
    klein = lorentz_to_klein(torch.stack((a, b)))
    middle = klein_to_lorentz(einstein_midpoint(klein, torch.ones(2, dtype=DOUBLE)))
    half = lorentz_distance(a, b) / 2
    assert torch.allclose(lorentz_distance(middle, a), half, rtol=1e-9)
    assert torch.allclose(lorentz_distance(middle, b), half, rtol=1e-9)


def test_einstein_midpoint_equals_the_normalised_lorentz_centroid():
    # an independent formula: sum_j w_j x_j rescaled onto the hyperboloid
    points = random_points(6, 3, scale=1.5, seed=15)
    weights = torch.rand(6, generator=torch.Generator().manual_seed(0), dtype=DOUBLE)
    centroid = (weights[:, None] * points).sum(0)
    centroid = centroid / torch.sqrt(-geoopt_math.inner(centroid, centroid))
    midpoint = einstein_midpoint(lorentz_to_klein(points), weights)
    assert torch.allclose(klein_to_lorentz(midpoint), centroid, rtol=1e-10)
    # precomputed factors (x_0) give the same
    with_factors = einstein_midpoint(lorentz_to_klein(points), weights, lorentz_factors=points[:, 0])
    assert torch.allclose(with_factors, midpoint, rtol=1e-12)


def test_einstein_midpoint_ignores_padded_points():
    points = lorentz_to_klein(random_points(2, 5, 3, seed=16))
    weights = torch.rand(2, 5, generator=torch.Generator().manual_seed(1), dtype=DOUBLE)
    mask = torch.tensor([[True, True, False, True, False], [True, False, False, False, False]])
    garbage = points.clone()
    garbage[~mask] = float("nan")
    noisy_weights = weights.clone()
    noisy_weights[~mask] = 100.0
    masked = einstein_midpoint(garbage, noisy_weights, mask)
    for b in range(2):
        alone = einstein_midpoint(points[b][mask[b]], weights[b][mask[b]])
        assert torch.allclose(masked[b], alone, rtol=1e-12)


# ------------------------------------------------------------------------ attention


def loop_attention(queries, keys, values, mask, beta, offset):
    """Eq. 8 one query and one key at a time, with geoopt's distance."""
    batch, count_q, _ = queries.shape
    out = torch.zeros(batch, count_q, values.shape[-1], dtype=DOUBLE)
    alphas = torch.zeros(batch, count_q, keys.shape[1], dtype=DOUBLE)
    for b in range(batch):
        for i in range(count_q):
            numerator = torch.zeros(values.shape[-1] - 1, dtype=DOUBLE)
            denominator = torch.zeros((), dtype=DOUBLE)
            for j in range(keys.shape[1]):
                if not mask[b, j]:
                    continue
                distance = geoopt_math.dist(queries[b, i], keys[b, j], k=UNIT)
                alpha = torch.sigmoid(-beta * distance - offset)
                klein = values[b, j, 1:] / values[b, j, 0]
                gamma = 1 / torch.sqrt(1 - klein.pow(2).sum())
                numerator = numerator + alpha * gamma * klein
                denominator = denominator + alpha * gamma
                alphas[b, i, j] = alpha
            midpoint = numerator / denominator
            out[b, i] = torch.cat((torch.ones(1, dtype=DOUBLE), midpoint)) / torch.sqrt(1 - midpoint.pow(2).sum())
    return out, alphas


def attention_inputs(seed=17, batch=2, count_q=3, count_k=4, dim=3, value_dim=2):
    queries = random_points(batch, count_q, dim, seed=seed)
    keys = random_points(batch, count_k, dim, seed=seed + 1)
    values = random_points(batch, count_k, value_dim, seed=seed + 2)
    mask = torch.tensor([[True, False, True, True], [False, False, True, False]])
    return queries, keys, values, mask


def test_lorentz_attention_matches_a_loop_over_eq_8():
    queries, keys, values, mask = attention_inputs()
    out, weights = lorentz_attention(queries, keys, values, mask, beta=1.3, offset=-0.2, return_weights=True)
    expected, expected_weights = loop_attention(queries, keys, values, mask, 1.3, -0.2)
    assert torch.allclose(out, expected, rtol=1e-9)
    assert torch.allclose(weights, expected_weights, rtol=1e-9)
    assert torch.allclose(minkowski_residual(out), torch.zeros(2, 3, dtype=DOUBLE), atol=1e-10)
    # and it is the Einstein midpoint of the values with the weights alpha
    klein = lorentz_to_klein(values)
    again = klein_to_lorentz(einstein_midpoint(klein.unsqueeze(1), weights, mask.unsqueeze(1)))
    assert torch.allclose(out, again, rtol=1e-10)


def test_lorentz_attention_ignores_padded_keys():
    queries, keys, values, mask = attention_inputs(seed=20)
    garbage_keys, garbage_values = keys.clone(), values.clone()
    garbage_keys[~mask] = float("nan")
    garbage_values[~mask] = 1e30
    out = lorentz_attention(queries, garbage_keys, garbage_values, mask, beta=1.0, offset=0.0)
    for b in range(2):
        alone = lorentz_attention(
            queries[b], keys[b][mask[b]], values[b][mask[b]], beta=1.0, offset=0.0
        )
        assert torch.allclose(out[b], alone, rtol=1e-12)


def test_lorentz_attention_with_identical_values_returns_that_value():
    queries, keys, _, _ = attention_inputs(seed=23)
    value = random_points(2, scale=2.0, seed=26)
    out = lorentz_attention(queries, keys, value.expand(2, 4, 3), beta=0.7, offset=0.5)
    assert torch.allclose(out, value.expand(2, 3, 3), rtol=1e-10)


def test_lorentz_attention_survives_underflowing_weights_in_float32():
    # every alpha underflows to 0 in float32 (beta d ~ 1e3): no 0/0, the nearest key wins
    queries, keys, values, _ = attention_inputs(seed=27)
    out, weights = lorentz_attention(
        queries.float(), keys.float(), values.float(), beta=1e3, offset=0.0, return_weights=True
    )
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(weights, torch.zeros_like(weights))  # every alpha is 0 in floating point
    nearest = lorentz_pairwise_distance(queries, keys).argmin(-1)
    expected = torch.gather(values, 1, nearest.unsqueeze(-1).expand(-1, -1, values.shape[-1]))
    assert torch.allclose(out.double(), expected, rtol=1e-4)
    # and far out on the hyperboloid (radius 50) everything stays finite
    far = lorentz_expmap0(random_directions(4, 3, seed=28, dtype=torch.float32) * 50.0)
    assert torch.isfinite(lorentz_attention(far[None], far[None], far[None], beta=1.0, offset=0.0)).all()


# -------------------------------------------------------------------------- gradcheck


def test_gradcheck_of_the_geometry():
    generator = torch.Generator().manual_seed(30)
    tangent = torch.randn(3, 4, generator=generator, dtype=DOUBLE, requires_grad=True)
    assert torch.autograd.gradcheck(lorentz_expmap0, (tangent,))
    assert torch.autograd.gradcheck(lambda v: lorentz_expmap0(v, max_radius=1.0), (tangent,))
    points = random_points(3, 4, seed=31).requires_grad_()
    others = random_points(3, 4, seed=32).requires_grad_()
    assert torch.autograd.gradcheck(lorentz_logmap0, (points,))
    assert torch.autograd.gradcheck(lorentz_project, (points,))
    assert torch.autograd.gradcheck(lorentz_distance, (points, others))
    assert torch.autograd.gradcheck(lorentz_pairwise_distance, (points, others))
    assert torch.autograd.gradcheck(lorentz_inner, (points, others))
    assert torch.autograd.gradcheck(lorentz_to_klein, (points,))
    klein = lorentz_to_klein(points.detach()).requires_grad_()
    assert torch.autograd.gradcheck(klein_to_lorentz, (klein,))
    assert torch.autograd.gradcheck(lorentz_factor, (klein,))
    assert torch.autograd.gradcheck(lambda v: clip_radius(v, 1.0), (tangent,))


def test_gradcheck_of_einstein_midpoint_and_attention():
    points = lorentz_to_klein(random_points(2, 4, 3, seed=33)).requires_grad_()
    weights = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(2), dtype=DOUBLE)
    weights = (weights + 0.1).requires_grad_()
    mask = torch.tensor([[True, True, False, True], [True, False, True, True]])
    assert torch.autograd.gradcheck(lambda p, w: einstein_midpoint(p, w, mask), (points, weights))
    queries, keys, values, mask = attention_inputs(seed=34)
    beta = torch.tensor(0.8, dtype=DOUBLE, requires_grad=True)
    offset = torch.tensor(0.3, dtype=DOUBLE, requires_grad=True)
    inputs = (*(t.requires_grad_() for t in (queries, keys, values)), beta, offset)

    def attention(q, k, v, scale, shift):
        out, alpha = lorentz_attention(q, k, v, mask, beta=scale, offset=shift, return_weights=True)
        return out, alpha

    assert torch.autograd.gradcheck(attention, inputs)


# ---------------------------------------------------------------------------- errors


def test_bad_inputs_raise_value_errors_naming_the_argument():
    points = random_points(2, 3, seed=35)
    bad = points.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="y contains NaN"):
        lorentz_distance(points, bad)
    with pytest.raises(ValueError, match="tangent contains Inf"):
        lorentz_expmap0(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="coordinates"):
        lorentz_distance(points, points[:, :3])
    with pytest.raises(ValueError, match="do not broadcast"):
        lorentz_distance(points, random_points(3, 3))
    with pytest.raises(ValueError, match="n \\+ 1 >= 2"):
        lorentz_logmap0(torch.ones(3, 1))
    with pytest.raises(ValueError, match="outside the unit ball"):
        lorentz_factor(torch.tensor([0.9, 0.9]))
    with pytest.raises(ValueError, match="positive time coordinate"):
        lorentz_to_klein(-points)
    with pytest.raises(ValueError, match="max_radius"):
        lorentz_expmap0(torch.ones(3), max_radius=0.0)
    klein = lorentz_to_klein(points)
    with pytest.raises(ValueError, match="non-negative"):
        einstein_midpoint(klein, torch.tensor([1.0, -1.0], dtype=DOUBLE))
    with pytest.raises(ValueError, match="positive sum"):
        einstein_midpoint(klein, torch.zeros(2, dtype=DOUBLE))
    with pytest.raises(ValueError, match="weights has 3 entries"):
        einstein_midpoint(klein, torch.ones(3, dtype=DOUBLE))


def test_bad_attention_inputs_raise_value_errors():
    queries, keys, values, mask = attention_inputs(seed=36)
    with pytest.raises(ValueError, match="masks must be a bool tensor"):
        lorentz_attention(queries, keys, values, mask.long(), beta=1.0, offset=0.0)
    with pytest.raises(ValueError, match="masks has shape"):
        lorentz_attention(queries, keys, values, mask[:, :3], beta=1.0, offset=0.0)
    empty = mask.clone()
    empty[1] = False
    with pytest.raises(ValueError, match="is all padding for sample"):
        lorentz_attention(queries, keys, values, empty, beta=1.0, offset=0.0)
    with pytest.raises(ValueError, match="must agree"):
        lorentz_attention(queries, keys, values[:, :3], beta=1.0, offset=0.0)
    with pytest.raises(ValueError, match="queries have 4 coordinates but keys have 3"):
        lorentz_attention(queries, keys[..., :3], values, beta=1.0, offset=0.0)
    bad = keys.clone()
    bad[0, 0, 0] = float("nan")  # a real key
    with pytest.raises(ValueError, match="keys contains NaN"):
        lorentz_attention(queries, bad, values, mask, beta=1.0, offset=0.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        lorentz_attention(queries, keys, values, beta=float("nan"), offset=0.0)


# ------------------------------------------------------- every message names its argument


def _refuses(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_every_check_names_the_argument_and_the_shapes():
    points = random_points(2, 3, seed=40)  # (2, 4)
    batched = random_points(2, 5, 3, seed=41)  # (2, 5, 4)
    ints = torch.ones(2, 4, dtype=torch.long)
    cases = [
        # inner and distance: x, y, coordinates, broadcasting
        (lambda: lorentz_inner(ints, points), r"^x must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_inner(points, ints), r"^y must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_inner(points, batched[..., :3]), r"^x has 4 coordinates but y has 3$"),
        (lambda: lorentz_inner(points, random_points(3, 3)), r"^x \(2, 4\) and y \(3, 4\) do not broadcast$"),
        (lambda: lorentz_distance(ints, points), r"^x must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_distance(points, ints), r"^y must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_distance(batched[..., :3], batched), r"^x has 3 coordinates but y has 4$"),
        (lambda: lorentz_distance(batched, random_points(3, 1, 3)), r"^x \(2, 5, 4\) and y \(3, 1, 4\) do not broadcast$"),
        # pairwise: at least (N, n + 1), leading dims broadcast
        (lambda: lorentz_pairwise_distance(points[0], points), r"^x must have at least 2 dims, got shape \(4,\)$"),
        (lambda: lorentz_pairwise_distance(points, points[0]), r"^y must have at least 2 dims, got shape \(4,\)$"),
        (lambda: lorentz_pairwise_distance(ints, points), r"^x must be a float tensor"),
        (lambda: lorentz_pairwise_distance(points, ints), r"^y must be a float tensor"),
        (lambda: lorentz_pairwise_distance(batched, batched[..., :3]), r"^x has 4 coordinates but y has 3$"),
        (lambda: lorentz_pairwise_distance(batched[..., :3], batched), r"^x has 3 coordinates but y has 4$"),
        (
            lambda: lorentz_pairwise_distance(batched, random_points(3, 5, 3)),
            r"^x \(2,\) and y \(3,\) do not broadcast$",
        ),
        # maps and projection
        (lambda: clip_radius(ints, 1.0), r"^tangent must be a float tensor, got dtype torch.int64$"),
        (lambda: clip_radius(points, 0.0), r"^max_radius must be positive, got 0.0$"),
        (lambda: lorentz_expmap0(ints), r"^tangent must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_expmap0(points, max_radius=0.0), r"^max_radius must be positive or None, got 0.0$"),
        (lambda: lorentz_logmap0(ints), r"^points must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_project(ints), r"^points must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_project(points[:, :1]), r"^points must have n \+ 1 >= 2 coordinates"),
        (lambda: lorentz_to_klein(ints), r"^points must be a float tensor, got dtype torch.int64$"),
        # Klein model
        (lambda: klein_to_lorentz(ints), r"^points_klein must be a float tensor, got dtype torch.int64$"),
        (lambda: lorentz_factor(ints), r"^points_klein must be a float tensor, got dtype torch.int64$"),
        (
            lambda: klein_to_lorentz(torch.tensor([0.8, 0.61])),
            r"^points_klein has points outside the unit ball \(\|v\| > 1\): not Klein points$",
        ),
        (
            lambda: klein_to_lorentz(torch.tensor([float("nan"), 0.0])),
            r"^points_klein contains NaN at index \(0,\)$",
        ),
    ]
    for call, message in cases:
        _refuses(call, message)


def test_the_upper_sheet_and_the_unit_ball_are_checked_at_their_boundaries():
    on_the_null_cone = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=DOUBLE)
    _refuses(
        lambda: lorentz_to_klein(on_the_null_cone),
        r"^points must have a positive time coordinate x_0 \(upper sheet\)$",
    )
    # the origin (x_0 = 1) is the centre of the Klein ball
    origin = torch.tensor([[1.0, 0.0, 0.0]], dtype=DOUBLE)
    assert torch.equal(lorentz_to_klein(origin), torch.zeros(1, 2, dtype=DOUBLE))
    # |v|^2 up to 1 + 1e-4 is accepted as rounding of a point on the boundary
    inside = torch.tensor([[1.00004, 0.0], [0.0, 0.5]], dtype=DOUBLE)
    factors = lorentz_factor(inside)
    eps = torch.finfo(DOUBLE).eps
    assert torch.allclose(factors, torch.tensor([eps**-0.5, 1 / math.sqrt(0.75)], dtype=DOUBLE))
    _refuses(lambda: lorentz_factor(torch.tensor([1.0001, 0.01], dtype=DOUBLE)), "outside the unit ball")


def test_einstein_midpoint_checks_name_the_argument():
    klein = lorentz_to_klein(random_points(2, 3, seed=42))  # (2, 3)
    weights = torch.ones(2, dtype=DOUBLE)
    cases = [
        (lambda: einstein_midpoint(klein.long(), weights), r"^points_klein must be a float tensor"),
        (lambda: einstein_midpoint(klein[0], weights), r"^points_klein must have at least 2 dims, got shape \(3,\)$"),
        (lambda: einstein_midpoint(klein, weights.long()), r"^weights must be a float tensor, got dtype torch.int64$"),
        (
            lambda: einstein_midpoint(klein, torch.ones(1, 1, 2, dtype=DOUBLE)),
            r"^weights must have shape \(\.\.\., N\) or \(\.\.\., Q, N\) for points_klein of shape "
            r"\(\.\.\., N, n\) = \(2, 3\), got \(1, 1, 2\)$",
        ),
        (lambda: einstein_midpoint(klein, torch.ones(3, 3, dtype=DOUBLE)), r"^weights has 3 entries per row, points_klein has N = 2$"),
        (lambda: einstein_midpoint(klein, weights, torch.ones(2)), r"^mask must be a bool tensor \(True = real step\)$"),
        (lambda: einstein_midpoint(klein, weights, torch.ones(3, dtype=torch.bool)), r"^mask has shape \(3,\), expected \(2,\)$"),
        (lambda: einstein_midpoint(klein * 2.0, weights), r"^points_klein has points outside the unit ball"),
        (lambda: einstein_midpoint(klein, weights * math.inf), r"^weights contains Inf at index \(0,\)$"),
        (lambda: einstein_midpoint(klein, -weights), r"^weights must be non-negative$"),
        (lambda: einstein_midpoint(klein, weights, lorentz_factors=weights.long()), r"^lorentz_factors must be a float tensor"),
        (
            lambda: einstein_midpoint(klein, weights, lorentz_factors=weights[:1]),
            r"^lorentz_factors has shape \(1,\), expected \(2,\)$",
        ),
        (lambda: einstein_midpoint(klein, weights, lorentz_factors=weights * math.nan), r"^lorentz_factors contains NaN at index \(0,\)$"),
        (lambda: einstein_midpoint(klein, weights, lorentz_factors=weights * 0.0), r"^lorentz_factors must be positive$"),
        (
            lambda: einstein_midpoint(klein, torch.tensor([0.0, 1.0], dtype=DOUBLE), torch.tensor([True, False])),
            r"^weights must have a positive sum over the real points of every row$",
        ),
    ]
    for call, message in cases:
        _refuses(call, message)
    # a padded point may lie anywhere (even outside the ball): its content is never read
    outside = klein.clone()
    outside[1] = 5.0
    mask = torch.tensor([True, False])
    assert torch.allclose(einstein_midpoint(outside, weights, mask), klein[0], rtol=1e-12)


def test_lorentz_attention_checks_name_the_argument():
    queries, keys, values, mask = attention_inputs(seed=43)  # (2, 3, 4), (2, 4, 4), (2, 4, 3)

    def attend(q=queries, k=keys, v=values, m=None, beta=1.0, offset=0.0):
        return lorentz_attention(q, k, v, m, beta=beta, offset=offset)

    upper = values.clone()
    upper[0, 2, 0] = -upper[0, 2, 0]  # a real value on the lower sheet
    zero_time = values.clone()
    zero_time[1, 0, 0] = 0.0  # x_0 = 0 exactly: not on the upper sheet either
    lower_padded = values.clone()
    lower_padded[0, 1, 0] = -1.0  # the same at a padded key: never read
    cases = [
        (lambda: attend(q=queries[0, 0]), r"^queries must have at least 2 dims, got shape \(4,\)$"),
        (lambda: attend(q=queries.long()), r"^queries must be a float tensor, got dtype torch.int64$"),
        (lambda: attend(q=queries[..., :1]), r"^queries must have n \+ 1 >= 2 coordinates"),
        (lambda: attend(k=keys[0, 0]), r"^keys must have at least 2 dims, got shape \(4,\)$"),
        (lambda: attend(k=keys.long()), r"^keys must be a float tensor, got dtype torch.int64$"),
        (lambda: attend(v=values[0, 0]), r"^values must have at least 2 dims, got shape \(3,\)$"),
        (lambda: attend(v=values.long()), r"^values must be a float tensor, got dtype torch.int64$"),
        (lambda: attend(k=keys[..., :3]), r"^queries have 4 coordinates but keys have 3$"),
        (
            lambda: attend(v=values[:, :3]),
            r"^keys \(2, 4, 4\) and values \(2, 3, 3\) must agree in all dims but the last$",
        ),
        (
            lambda: attend(q=random_points(3, 3, 3)),
            r"^queries \(3,\) and keys \(2,\) do not broadcast$",
        ),
        (lambda: attend(m=mask.float()), r"^masks must be a bool tensor \(True = real step\)$"),
        (lambda: attend(m=mask[:, :2]), r"^masks has shape \(2, 2\), expected \(2, 4\)$"),
        (lambda: attend(k=keys * math.inf), r"^keys contains Inf at index \(0, 0, 0\)$"),
        (lambda: attend(v=values * math.nan), r"^values contains NaN at index \(0, 0, 0\)$"),
        (lambda: attend(v=upper), r"^values must have a positive time coordinate x_0 \(upper sheet\)$"),
        (lambda: attend(v=upper, m=mask), r"^values must have a positive time coordinate x_0 \(upper sheet\)$"),
        (lambda: attend(v=zero_time), r"^values must have a positive time coordinate x_0 \(upper sheet\)$"),
        (lambda: attend(beta=torch.tensor(1)), r"^beta must be a float tensor or a number, got torch.int64$"),
        (lambda: attend(offset=torch.tensor(1)), r"^offset must be a float tensor or a number, got torch.int64$"),
        (lambda: attend(beta=torch.tensor(math.inf)), r"^beta contains Inf at index \(\)$"),
        (lambda: attend(offset=torch.tensor(math.nan)), r"^offset contains NaN at index \(\)$"),
        (lambda: attend(beta=math.inf), r"^beta must be finite, got inf$"),
        (lambda: attend(offset=-math.inf), r"^offset must be finite, got -inf$"),
    ]
    for call, message in cases:
        _refuses(call, message)
    # at padded keys the values (and keys) may be anything: masked in, same as without
    garbage_keys = keys.clone()
    garbage_keys[~mask] = math.nan
    padded = attend(k=garbage_keys, v=lower_padded, m=mask)
    assert torch.allclose(padded, attend(m=mask), rtol=1e-12)


def test_klein_functions_on_batched_points_against_loops():
    points = random_points(2, 3, 4, scale=1.2, seed=44)  # (B, N, n + 1)
    klein = lorentz_to_klein(points)  # (B, N, n)
    factors = lorentz_factor(klein)
    weights = torch.rand(2, 3, generator=torch.Generator().manual_seed(3), dtype=DOUBLE) + 0.1
    # any positive factors are accepted, below 1 too (a caller's own weighting)
    own_factors = torch.tensor([[0.5, 1.0, 2.0], [1.0, 0.25, 3.0]], dtype=DOUBLE)
    midpoints = einstein_midpoint(klein, weights, lorentz_factors=own_factors)
    assert factors.shape == (2, 3) and midpoints.shape == (2, 4)
    for b in range(2):
        numerator, denominator = torch.zeros(4, dtype=DOUBLE), 0.0
        for j in range(3):
            v = klein[b, j]
            assert math.isclose(float(factors[b, j]), 1 / math.sqrt(1 - float(v @ v)), rel_tol=1e-12)
            numerator += weights[b, j] * own_factors[b, j] * v
            denominator += float(weights[b, j] * own_factors[b, j])
        assert torch.allclose(midpoints[b], numerator / denominator, rtol=1e-12)
    _refuses(
        lambda: einstein_midpoint(klein, weights, lorentz_factors=own_factors[:1]),
        r"^lorentz_factors has shape \(1, 3\), expected \(2, 3\)$",
    )


def test_pairwise_distance_keeps_float32_and_a_single_query_row_keeps_its_axis():
    x = random_points(2, 3, 4, seed=45)
    y = random_points(2, 5, 4, seed=46)
    single = lorentz_pairwise_distance(x.float(), y.float())
    assert single.dtype == torch.float32
    assert torch.allclose(single.double(), geoopt_math.dist(x[:, :, None], y[:, None], k=UNIT), rtol=1e-5)
    # Einstein midpoint with (..., Q, N) weights and Q = 1: the Q axis stays
    klein = lorentz_to_klein(y)
    weights = torch.rand(2, 1, 5, generator=torch.Generator().manual_seed(4), dtype=DOUBLE)
    midpoint = einstein_midpoint(klein, weights)
    assert midpoint.shape == (2, 1, 4)
    assert torch.allclose(midpoint[:, 0], einstein_midpoint(klein, weights[:, 0]), rtol=1e-12)


def test_logmap0_at_the_origin_has_the_identity_jacobian():
    # log_0 is the inverse of exp_0, whose Jacobian at 0 is (0; I): log_0's is (0 | I)
    origin = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=DOUBLE)
    jacobian = torch.autograd.functional.jacobian(lorentz_logmap0, origin)
    expected = torch.cat((torch.zeros(3, 1, dtype=DOUBLE), torch.eye(3, dtype=DOUBLE)), dim=1)
    assert torch.equal(lorentz_logmap0(origin), torch.zeros(3, dtype=DOUBLE))
    assert torch.allclose(jacobian, expected)


def test_lorentz_attention_ignores_nan_at_padded_values():
    queries, keys, values, mask = attention_inputs(seed=21)
    expected = lorentz_attention(queries, keys, values, mask, beta=1.0, offset=0.0)
    dirty = values.clone()
    dirty[~mask] = float("nan")
    assert torch.equal(lorentz_attention(queries, keys, dirty, mask, beta=1.0, offset=0.0), expected)


def test_lorentz_attention_of_float32_points_is_computed_in_float64():
    # float32 points are widened exactly, so the float32 result is the float64 result of the
    # same points rounded once; the weights come back in float32 too.
    queries, keys, values, mask = (t.float() if t.is_floating_point() else t for t in attention_inputs(seed=22))
    out, weights = lorentz_attention(queries, keys, values, mask, beta=1.3, offset=-0.2, return_weights=True)
    wide, wide_weights = lorentz_attention(
        queries.double(), keys.double(), values.double(), mask, beta=1.3, offset=-0.2, return_weights=True
    )
    assert out.dtype == torch.float32 and weights.dtype == torch.float32
    assert torch.equal(out, wide.float()) and torch.equal(weights, wide_weights.float())


def test_lorentz_attention_accepts_a_value_at_the_origin():
    # The origin (1, 0, ..., 0) is on the upper sheet (x_0 = 1): a value there is valid.
    queries, keys, values, mask = attention_inputs(seed=23)
    values = values.clone()
    values[0, 0] = torch.tensor([1.0, 0.0, 0.0], dtype=values.dtype)
    out, weights = lorentz_attention(queries, keys, values, mask, beta=1.3, offset=-0.2, return_weights=True)
    expected, expected_weights = loop_attention(queries, keys, values, mask, 1.3, -0.2)
    assert torch.allclose(out, expected, rtol=1e-9) and torch.allclose(weights, expected_weights, rtol=1e-9)


def test_lorentz_inner_keepdim_and_coordinate_message():
    x, y = random_points(2, 3, 3, seed=24), random_points(2, 3, 3, seed=25)
    expected = -x[..., 0] * y[..., 0] + (x[..., 1:] * y[..., 1:]).sum(-1)
    kept = lorentz_inner(x, y, keepdim=True)
    assert kept.shape == (2, 3, 1) and torch.allclose(kept[..., 0], expected, rtol=1e-12)
    with pytest.raises(ValueError, match=r"^x has 4 coordinates but y has 3$"):
        lorentz_inner(x, y[..., :3])


def test_lorentz_distance_to_a_point_whose_spatial_norm_is_one():
    # y = (sqrt 2, 1, 0) is on the hyperboloid with |y_1:| = 1 exactly; d = arcosh(-<x, y>_L).
    y = torch.tensor([math.sqrt(2.0), 1.0, 0.0], dtype=DOUBLE)
    x = torch.tensor([math.cosh(0.7), math.sinh(0.7) * 0.6, math.sinh(0.7) * 0.8], dtype=DOUBLE)
    expected = math.acosh(x[0].item() * y[0].item() - x[1].item() * y[1].item())
    assert lorentz_distance(x, y).item() == pytest.approx(expected, rel=1e-10)


def test_expmap0_caps_float32_radii_one_unit_below_coshs_overflow():
    """The dtype's cap is log(max) - 1 (87.72 in float32): a radius of 87.5 is kept, 88.5 is
    brought down to the cap, and cosh stays finite at both."""
    for radius, expected in [(87.5, 87.5), (88.5, math.log(torch.finfo(torch.float32).max) - 1.0)]:
        point = lorentz_expmap0(torch.tensor([radius, 0.0]))
        assert torch.isfinite(point).all()
        assert torch.asinh(point[1:].double().norm()).item() == pytest.approx(expected, abs=1e-4)


def test_distance_is_exactly_zero_on_the_diagonal_at_unit_spatial_norm():
    """A point whose |x_{1:n}| rounds to exactly 1 while x_{1:n}.x_{1:n} does not: the
    direction form of the angular term must be used (the dot form leaves 1e-16 behind)."""
    spatial = torch.tensor([0.34306484171080476, 0.712779517105725, -0.6117612887200938], dtype=DOUBLE)
    assert torch.linalg.vector_norm(spatial).item() == 1.0
    assert (spatial * spatial).sum().item() == 1.0 - 2.0**-53  # 1 - x.x is 1.1e-16, not 0
    point = torch.cat([torch.tensor([math.sqrt(2.0)], dtype=DOUBLE), spatial])
    assert lorentz_distance(point, point).item() == 0.0
    assert lorentz_distance(point[None], point[None]).item() == 0.0


def test_klein_points_exactly_at_the_tolerance_are_accepted():
    """|v|^2 = 1 + 1e-4 exactly is inside the documented tolerance; one ulp more is not."""
    inside = torch.tensor([0.8730477016258977, 0.487737337801544], dtype=DOUBLE)
    assert inside.pow(2).sum().item() == 1.0 + 1e-4
    assert torch.isfinite(klein_to_lorentz(inside)).all()
    assert torch.isfinite(lorentz_factor(inside)).all()
    outside = inside.clone()
    outside[0] = torch.nextafter(inside[0], torch.tensor(2.0, dtype=DOUBLE))
    with pytest.raises(ValueError, match="outside the unit ball"):
        klein_to_lorentz(outside)
