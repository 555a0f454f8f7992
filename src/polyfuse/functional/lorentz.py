"""Lorentz-model geometry and Chimera's hyperbolic attention (Chimera Eq. 6 and 8).

Shapes: ``...`` any leading dims (batch, heads), ``N`` keys / points, ``Q`` queries,
``n`` hyperbolic dimension. A point of the n-dimensional hyperboloid has n + 1
ambient coordinates, the time coordinate x_0 first; a point of the Klein model and
a Euclidean (tangent) vector have n.

Conventions (note 10 of the papers' README, curvature -1):

    <x, y>_L = sum_{i>=1} x_i y_i - x_0 y_0,        d_L(x, y) = arcosh(-<x, y>_L)
    H^n = {x : <x, x>_L = -1, x_0 > 0}

geoopt's ``Lorentz`` manifold with ``k = 1`` (its k is the inverse of minus the
curvature, -1/k = -1) uses exactly these conventions: its ``inner`` is the same bilinear form,
its ``dist`` is sqrt(k) arcosh(-<x,y>_L / k) and its origin is (sqrt(k), 0, ..., 0);
the tests check this numerically. The inner product, the exponential map of the
polar form and the projection are geoopt's; the functions here add input checks and
the following safe handling where geoopt is weak in float32 (or, for distances and
the log map, formulas that are exact on the hyperboloid and stable off the diagonal):

* **Distances.** geoopt evaluates arcosh(-<x, y>_L) in the input dtype. In float32,
  x_0 y_0 overflows above radius ~44, and since -<x, x>_L = 1 is the difference of
  two numbers of size x_0^2, d(x, x) comes out as NaN, -inf or several units from
  radius ~5 on (and slightly negative near the origin). Differencing the points
  first (d = 2 arsinh(|x - y|_L / 2)) fixes the diagonal but not far pairs: each
  float32 point is off the hyperboloid by ~1e-7 x_0^2, which swamps |x - y|_L^2
  when one point is far out and the other near the origin. We use the polar forms
  x = (cosh r, sinh r u), y = (cosh s, sinh s w), read from the spatial parts:
  -<x, y>_L - 1 = 2 sinh^2((r - s) / 2) + sinh r sinh s (1 - u.w), a sum of
  non-negative terms, evaluated in float64 (as geoopt's documentation recommends for
  this manifold): exact zero diagonal, exact symmetry, relative accuracy for near and
  far pairs, nothing overflows below radius ~350. The tests check it against
  geoopt's ``dist`` wherever geoopt is accurate.
* **Exponential map.** Radii are capped at ``log(finfo(dtype).max) - 1`` (87.7 in
  float32, 708.8 in float64) so that cosh stays finite, or at a smaller
  ``max_radius`` chosen by the caller; the zero vector maps to the origin, with the
  map's true Jacobian there (the polar form alone would give 0).
* **Logarithmic map.** geoopt's ``logmap0`` reads the radius as arcosh(x_0): in
  float32 x_0 rounds to 1 below radius ~3e-4 and every such radius comes back as
  ~3e-8. We use arsinh(|x_{1:n}|), equal on the hyperboloid and accurate at both ends.
* **Klein model.** The Klein radius of a point at hyperbolic radius r is tanh r, which
  rounds to 1 above r ~ 8.7 (float32) or ~ 18.7 (float64); the Lorentz factor
  1 / sqrt(1 - |v|^2) is capped at 1 / sqrt(eps). Inside :func:`lorentz_attention`
  the factor of a hyperboloid point is taken as its x_0 (exact: 1 - |x_s / x_0|^2 =
  1 / x_0^2 on the hyperboloid), which never saturates.

What "on the hyperboloid" can mean in floating point: a point at radius r has
coordinates of size cosh r, each rounded to a relative 2^-24 in float32, so
<x, x>_L + 1 is only known to about 1e-7 x_0^2. An absolute error of 1e-5 is thus
attainable only up to radius ~3 in float32; at radius 50, x_0^2 = 7e42 does not even
fit in float32. We therefore state (and test) the constraint relative to the size of
its terms: |<x, x>_L + 1| <= 1e-5 x_0^2 (equivalently, x_0 equals sqrt(1 + |x_s|^2)
to a relative 5e-6), evaluated in float64; near the origin, where x_0 ~ 1, this is
the absolute bound. Capping the radius at ~3 instead would have bought the absolute
bound at the price of flattening every tangent vector of norm above 3 onto one
sphere, a far larger distortion than a relative error of 1e-7.

Under ``torch.autocast`` (bfloat16 or float16) every public function here computes in
float32 with autocast off (:func:`polyfuse._precision.float32_under_autocast`; the
distances and the attention's aggregation still in float64) and returns float32: a
bfloat16 x_0 ~ e^r / 2 would carry 8 bits, and the hyperboloid constraint none.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
from torch import Tensor

from polyfuse._checks import check_finite, check_float_tensor, check_hyperboloid_points, check_mask
from polyfuse._precision import float32_under_autocast

__all__ = [
    "clip_radius",
    "einstein_midpoint",
    "klein_to_lorentz",
    "lorentz_attention",
    "lorentz_distance",
    "lorentz_expmap0",
    "lorentz_factor",
    "lorentz_inner",
    "lorentz_logmap0",
    "lorentz_pairwise_distance",
    "lorentz_project",
    "lorentz_to_klein",
]

_WORK_DTYPE = torch.float64


@functools.cache
def _geoopt_lorentz():
    """geoopt's Lorentz functions, imported on first use: geoopt imports scipy, which
    would double the time of ``import polyfuse``."""
    with warnings.catch_warnings():
        # geoopt 0.5 decorates its Lorentz functions with torch.jit.script, which recent
        # torch deprecates with one warning per function at import: nothing a user of
        # polyfuse can act on.
        warnings.filterwarnings(
            "ignore", message="`torch.jit.script` is deprecated", category=DeprecationWarning
        )
        from geoopt.manifolds.lorentz import math as geoopt_lorentz
    return geoopt_lorentz


# ----------------------------------------------------------------------------- checks


def _broadcast(name_a: str, shape_a: torch.Size, name_b: str, shape_b: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(shape_a, shape_b)
    except RuntimeError:
        raise ValueError(
            f"{name_a} {tuple(shape_a)} and {name_b} {tuple(shape_b)} do not broadcast"
        ) from None


def _as_work_tensor(value: float | Tensor, name: str, like: Tensor) -> Tensor:
    """A number or a tensor (kept in the autograd graph) in the dtype of ``like``."""
    if isinstance(value, Tensor):
        if not value.is_floating_point():
            raise ValueError(f"{name} must be a float tensor or a number, got {value.dtype}")
        check_finite(value, name)
        return value.to(dtype=like.dtype, device=like.device)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return torch.tensor(value, dtype=like.dtype, device=like.device)


# ------------------------------------------------------------------- small helpers


def _safe_sqrt(value: Tensor) -> Tensor:
    """sqrt(max(value, 0)) whose gradient is 0 (not inf or NaN) where value <= 0."""
    positive = value > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, value, 1.0)), 0.0)


def _origin(size: int, device: torch.device) -> Tensor:
    """The origin (1, 0, ..., 0) of the hyperboloid, with ``size`` = n + 1 coordinates."""
    origin = torch.zeros(size, dtype=_WORK_DTYPE, device=device)
    origin[0] = 1.0
    return origin


def _max_radius_for(dtype: torch.dtype) -> float:
    """Largest radius whose cosh is finite in ``dtype``, with one unit of headroom."""
    return math.log(torch.finfo(dtype).max) - 1.0


def _polar(points: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Polar form read from the spatial part, in float64: (radius, sinh radius, x_{1:n}).

    On the hyperboloid |x_{1:n}| = sinh r, so r = arsinh |x_{1:n}|; x_0 is not read.
    """
    spatial = points[..., 1:].to(_WORK_DTYPE)
    sinh_radius = torch.linalg.vector_norm(spatial, dim=-1)
    return torch.asinh(sinh_radius), sinh_radius, spatial


def _distance_from_excess(excess: Tensor) -> Tensor:
    # cosh d = 1 + a with a >= 0, so d = arcosh(1 + a) = 2 arsinh(sqrt(a / 2)); this
    # form is exact at a = 0 and its gradient is safe there (Chimera Eq. 6).
    return 2.0 * torch.asinh(_safe_sqrt(0.5 * excess))


def _radial_excess(radius_x: Tensor, radius_y: Tensor) -> Tensor:
    # cosh(r_x - r_y) - 1 = 2 sinh^2((r_x - r_y) / 2): the part of -<x, y>_L - 1 that
    # points on one ray would have
    return 2.0 * torch.sinh(0.5 * (radius_x - radius_y)).pow(2)


# -------------------------------------------------------------- Lorentz model basics


@float32_under_autocast
def lorentz_inner(x: Tensor, y: Tensor, *, keepdim: bool = False) -> Tensor:
    """Lorentzian scalar product <x, y>_L = sum_{i>=1} x_i y_i - x_0 y_0 (Chimera Eq. 6).

    geoopt's ``inner``, evaluated in the input dtype (in float32 it overflows for
    points beyond radius ~44; use :func:`lorentz_distance` for distances).

    Args:
        x: (..., n + 1) ambient vectors, time coordinate first.
        y: (..., n + 1), broadcastable with ``x``.
        keepdim: keep the reduced last dim (size 1).

    Returns:
        (...) tensor, or (..., 1) with ``keepdim``.
    """
    check_hyperboloid_points(x, "x")
    check_hyperboloid_points(y, "y")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x has {x.shape[-1]} coordinates but y has {y.shape[-1]}")
    _broadcast("x", x.shape, "y", y.shape)
    return _geoopt_lorentz().inner(x, y, keepdim=keepdim)


@float32_under_autocast
def lorentz_distance(x: Tensor, y: Tensor, *, keepdim: bool = False) -> Tensor:
    """Geodesic distance d_L(x, y) = arcosh(-<x, y>_L) on the hyperboloid (Chimera Eq. 6).

    Evaluated in float64 through the polar forms x = (cosh r, sinh r u) and
    y = (cosh s, sinh s w) (see the module docstring):

        -<x, y>_L - 1 = 2 sinh^2((r - s) / 2) + sinh r sinh s |u - w|^2 / 2 >= 0,
        d_L = 2 arsinh(sqrt((-<x, y>_L - 1) / 2))

    a sum of non-negative terms, so nothing cancels: the result equals geoopt's
    ``dist`` (k = 1) on the hyperboloid and is exactly zero on the diagonal, exactly
    symmetric, non-negative, accurate for both small and large distances, finite up
    to radius ~350, with a finite gradient everywhere (0 where x = y, a valid
    subgradient).
    Only the spatial part x_{1:n} is read (r = arsinh |x_{1:n}|), i.e. a point off
    the hyperboloid is measured as its :func:`lorentz_project`-ion. Pairs are formed
    by broadcasting; for all pairs of two sets without an (..., N, M, n) intermediate
    use :func:`lorentz_pairwise_distance`.

    Args:
        x: (..., n + 1) points on the hyperboloid.
        y: (..., n + 1) points, broadcastable with ``x``.
        keepdim: keep the reduced last dim (size 1).

    Returns:
        (...) distances (or (..., 1)) in the promoted dtype of ``x`` and ``y``.
    """
    check_hyperboloid_points(x, "x")
    check_hyperboloid_points(y, "y")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x has {x.shape[-1]} coordinates but y has {y.shape[-1]}")
    _broadcast("x", x.shape, "y", y.shape)
    radius_x, sinh_x, spatial_x = _polar(x)
    radius_y, sinh_y, spatial_y = _polar(y)
    direction_x = spatial_x / torch.where(sinh_x > 0, sinh_x, 1.0).unsqueeze(-1)
    direction_y = spatial_y / torch.where(sinh_y > 0, sinh_y, 1.0).unsqueeze(-1)
    # sinh r sinh s (1 - u.w) with 1 - u.w = |u - w|^2 / 2: no cancellation for near
    # pairs. At the exact origin (no direction) the equal expression |x_s| |y_s| -
    # x_s . y_s (zero there too) is used, for its gradient.
    angular = sinh_x * sinh_y * 0.5 * (direction_x - direction_y).pow(2).sum(-1)
    at_origin = (sinh_x == 0) | (sinh_y == 0)
    angular_dot = sinh_x * sinh_y - (spatial_x * spatial_y).sum(-1)
    angular = torch.where(at_origin, angular_dot, angular)
    excess = _radial_excess(radius_x, radius_y) + angular
    distance = _distance_from_excess(excess).to(torch.promote_types(x.dtype, y.dtype))
    return distance.unsqueeze(-1) if keepdim else distance


def _pairwise_distance(x: Tensor, y: Tensor) -> Tensor:
    """Unchecked float64 core of :func:`lorentz_pairwise_distance`: (..., N, M)."""
    radius_x, sinh_x, spatial_x = _polar(x)
    radius_y, sinh_y, spatial_y = _polar(y)
    # sinh r sinh s (1 - cos(angle)) = |x_s| |y_s| - x_s . y_s, from one matrix product
    angular = (
        sinh_x.unsqueeze(-1) * sinh_y.unsqueeze(-2) - spatial_x @ spatial_y.transpose(-1, -2)
    ).clamp_min(0.0)
    excess = _radial_excess(radius_x.unsqueeze(-1), radius_y.unsqueeze(-2)) + angular
    return _distance_from_excess(excess)


@float32_under_autocast
def lorentz_pairwise_distance(x: Tensor, y: Tensor) -> Tensor:
    """All pairwise distances d_L(x_i, y_j) (Chimera Eq. 6) with O(N M) memory.

    The same formula as :func:`lorentz_distance`, with the angular term written as
    |x_{1:n}| |y_{1:n}| - x_{1:n} . y_{1:n} and taken from one matrix product
    (float64). That difference cancels for nearly parallel points: distances below
    ~1e-8 sinh r are not resolved (d(x, x) is ~1e-8 sinh r rather than exactly 0,
    e.g. 1e-4 at radius 10), which does not matter for attention weights.

    Args:
        x: (..., N, n + 1) points on the hyperboloid.
        y: (..., M, n + 1) points; leading dims broadcast with those of ``x``.

    Returns:
        (..., N, M) distances in the promoted dtype of ``x`` and ``y``.
    """
    check_hyperboloid_points(x, "x", min_dim=2)
    check_hyperboloid_points(y, "y", min_dim=2)
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x has {x.shape[-1]} coordinates but y has {y.shape[-1]}")
    _broadcast("x", x.shape[:-2], "y", y.shape[:-2])
    return _pairwise_distance(x, y).to(torch.promote_types(x.dtype, y.dtype))


@float32_under_autocast
def clip_radius(tangent: Tensor, max_radius: float) -> Tensor:
    """Rescale the vectors whose Euclidean norm exceeds ``max_radius`` to that norm.

    Args:
        tangent: (..., n) vectors.
        max_radius: positive bound on the norm.

    Returns:
        (..., n) vectors, unchanged where their norm is at most ``max_radius``.
    """
    check_float_tensor(tangent, "tangent")
    if not max_radius > 0:
        raise ValueError(f"max_radius must be positive, got {max_radius}")
    radius = torch.linalg.vector_norm(tangent, dim=-1, keepdim=True)
    return tangent * (max_radius / radius.clamp_min(max_radius))


@float32_under_autocast
def lorentz_expmap0(tangent: Tensor, *, max_radius: float | None = None) -> Tensor:
    """Exponential map at the origin through the polar form (note 10; Chimera sec. 3.6).

    A Euclidean vector v in R^n, read as a tangent vector at the origin (1, 0, ..., 0),
    is written in polar form (direction v / |v|, radius |v|) and mapped to
    (cosh |v|, sinh |v| v / |v|) by geoopt's ``project_polar`` (k = 1); this equals
    geoopt's ``expmap0`` of (0, v). Radii are capped at ``max_radius`` if given and
    always at the largest radius whose cosh is finite in the dtype (87.7 in float32),
    the direction being kept. The polar form has no direction at v = 0: there we add
    v itself to the spatial part, which changes no value (v = 0 maps to the origin)
    and restores the map's true Jacobian (0; I) at the origin instead of 0.

    Args:
        tangent: (..., n) Euclidean vectors.
        max_radius: optional cap on the radius |v| (a documented clipping, e.g. to keep
            float32 distances resolvable; None applies only the dtype's cap).

    Returns:
        (..., n + 1) points on the hyperboloid.
    """
    check_float_tensor(tangent, "tangent")
    check_finite(tangent, "tangent")
    if max_radius is not None and not max_radius > 0:
        raise ValueError(f"max_radius must be positive or None, got {max_radius}")
    limit = _max_radius_for(tangent.dtype)
    if max_radius is not None:
        limit = min(limit, float(max_radius))
    radius = torch.linalg.vector_norm(tangent, dim=-1, keepdim=True)
    at_origin = radius == 0
    direction = tangent / torch.where(at_origin, 1.0, radius)
    polar = torch.cat((direction, radius.clamp_max(limit)), dim=-1)
    unit = torch.ones((), dtype=tangent.dtype, device=tangent.device)
    points = _geoopt_lorentz().project_polar(polar, k=unit)
    first_order = torch.where(at_origin, tangent, 0.0)  # zero in value, I in gradient
    return points + torch.cat((torch.zeros_like(radius), first_order), dim=-1)


@float32_under_autocast
def lorentz_logmap0(points: Tensor) -> Tensor:
    """Logarithmic map at the origin, the inverse of :func:`lorentz_expmap0`.

    For x = (cosh r, sinh r u) it returns r u, with r = arsinh(|x_{1:n}|) read from
    the spatial part (geoopt's ``logmap0`` uses arcosh(x_0), which loses every radius
    below ~3e-4 in float32), evaluated in float64 (|x_{1:n}|^2 overflows float32
    above radius ~44). For a point off the hyperboloid this equals the log map of its
    :func:`lorentz_project`-ion.

    Args:
        points: (..., n + 1) points on the hyperboloid.

    Returns:
        (..., n) Euclidean (tangent) vectors, in the input dtype.
    """
    check_hyperboloid_points(points, "points")
    radius, sinh_radius, spatial = _polar(points)
    nonzero = (sinh_radius > 0).unsqueeze(-1)
    safe = torch.where(nonzero, sinh_radius.unsqueeze(-1), 1.0)
    scale = torch.where(nonzero, radius.unsqueeze(-1) / safe, 1.0)  # arsinh(s) / s -> 1
    return (spatial * scale).to(points.dtype)


@float32_under_autocast
def lorentz_project(points: Tensor) -> Tensor:
    """Projection onto the hyperboloid: x_0 <- sqrt(1 + |x_{1:n}|^2), spatial part kept.

    geoopt's ``project`` (k = 1), evaluated in float64 so that |x_{1:n}|^2 does not
    overflow in float32 (it would above |x_{1:n}| ~ 1.8e19, radius ~44).

    Args:
        points: (..., n + 1) ambient vectors.

    Returns:
        (..., n + 1) points on the hyperboloid, in the input dtype.
    """
    check_hyperboloid_points(points, "points")
    unit = torch.ones((), dtype=_WORK_DTYPE, device=points.device)
    return _geoopt_lorentz().project(points.to(_WORK_DTYPE), k=unit).to(points.dtype)


# ------------------------------------------------------------------- Klein model


@float32_under_autocast
def lorentz_to_klein(points: Tensor) -> Tensor:
    """Map from the hyperboloid to the Klein model: v = x_{1:n} / x_0 (note 10).

    Args:
        points: (..., n + 1) points on the hyperboloid (x_0 > 0).

    Returns:
        (..., n) points of the open unit ball (radius tanh r for hyperbolic radius r).
    """
    check_hyperboloid_points(points, "points")
    if bool((points[..., 0] <= 0).any()):
        raise ValueError("points must have a positive time coordinate x_0 (upper sheet)")
    return points[..., 1:] / points[..., :1]


def _klein_to_lorentz(points_klein: Tensor) -> Tensor:
    eps = torch.finfo(points_klein.dtype).eps
    gap = (1.0 - points_klein.pow(2).sum(-1, keepdim=True)).clamp_min(eps)
    gamma = torch.rsqrt(gap)
    return torch.cat((gamma, gamma * points_klein), dim=-1)


def _check_klein(points_klein: Tensor, name: str, mask: Tensor | None = None) -> None:
    check_float_tensor(points_klein, name)
    check_finite(points_klein, name, mask)
    outside = points_klein.pow(2).sum(-1) > 1.0 + 1e-4
    if mask is not None:
        outside = outside & mask
    if bool(outside.any()):
        raise ValueError(f"{name} has points outside the unit ball (|v| > 1): not Klein points")


@float32_under_autocast
def klein_to_lorentz(points_klein: Tensor) -> Tensor:
    """Map from the Klein model to the hyperboloid: x = gamma(v) (1, v) (note 10).

    The Lorentz factor gamma(v) = 1 / sqrt(1 - |v|^2) is capped at 1 / sqrt(eps)
    (2896 in float32), i.e. points within eps of the boundary land at radius
    ~8.7 (float32) or ~18.7 (float64).

    Args:
        points_klein: (..., n) points of the unit ball.

    Returns:
        (..., n + 1) points on the hyperboloid.
    """
    _check_klein(points_klein, "points_klein")
    return _klein_to_lorentz(points_klein)


@float32_under_autocast
def lorentz_factor(points_klein: Tensor) -> Tensor:
    """Lorentz factor gamma(v) = 1 / sqrt(1 - |v|^2) of Klein points (Chimera Eq. 8).

    1 - |v|^2 is floored at the dtype's eps, so gamma is at most 1 / sqrt(eps).

    Args:
        points_klein: (..., n) points of the unit ball.

    Returns:
        (...) factors, >= 1.
    """
    _check_klein(points_klein, "points_klein")
    eps = torch.finfo(points_klein.dtype).eps
    return torch.rsqrt((1.0 - points_klein.pow(2).sum(-1)).clamp_min(eps))


@float32_under_autocast
def einstein_midpoint(
    points_klein: Tensor,
    weights: Tensor,
    mask: Tensor | None = None,
    *,
    lorentz_factors: Tensor | None = None,
) -> Tensor:
    """Weighted Einstein midpoint in the Klein model (Chimera Eq. 8, Ungar 2005).

        m = sum_j [w_j gamma(v_j) / sum_l w_l gamma(v_l)] v_j

    Args:
        points_klein: (..., N, n) Klein points v_j.
        weights: non-negative, either (..., N) for one midpoint per batch entry or
            (..., Q, N) for Q midpoints (one row of weights each, as in attention).
        mask: optional (..., N) bool, True = a real point; padded points get weight 0
            and their content is never read.
        lorentz_factors: optional (..., N) precomputed gamma(v_j); pass x_0 of the
            hyperboloid points when v_j = x_{1:n} / x_0, which stays exact where
            1 - |v_j|^2 underflows (radius above ~8.7 in float32).

    Returns:
        (..., n) or (..., Q, n) Klein points.
    """
    check_float_tensor(points_klein, "points_klein", min_dim=2)
    check_float_tensor(weights, "weights")
    single = weights.dim() == points_klein.dim() - 1
    if not single and weights.dim() != points_klein.dim():
        raise ValueError(
            f"weights must have shape (..., N) or (..., Q, N) for points_klein of shape "
            f"(..., N, n) = {tuple(points_klein.shape)}, got {tuple(weights.shape)}"
        )
    count = points_klein.shape[-2]
    if weights.shape[-1] != count:
        raise ValueError(f"weights has {weights.shape[-1]} entries per row, points_klein has N = {count}")
    point_mask = None
    if mask is not None:
        point_mask = check_mask(mask, points_klein.shape[:-1], "mask")
    _check_klein(points_klein, "points_klein", point_mask)
    check_finite(weights, "weights")
    if bool((weights < 0).any()):
        raise ValueError("weights must be non-negative")
    if lorentz_factors is None:
        eps = torch.finfo(points_klein.dtype).eps
        factors = torch.rsqrt((1.0 - points_klein.pow(2).sum(-1)).clamp_min(eps))
    else:
        check_float_tensor(lorentz_factors, "lorentz_factors")
        if lorentz_factors.shape != points_klein.shape[:-1]:
            raise ValueError(
                f"lorentz_factors has shape {tuple(lorentz_factors.shape)}, expected "
                f"{tuple(points_klein.shape[:-1])}"
            )
        check_finite(lorentz_factors, "lorentz_factors")
        if bool((lorentz_factors <= 0).any()):
            raise ValueError("lorentz_factors must be positive")
        factors = lorentz_factors
    if point_mask is not None:
        points_klein = points_klein.masked_fill(~point_mask.unsqueeze(-1), 0.0)
        factors = factors.masked_fill(~point_mask, 0.0)
    rows = weights.unsqueeze(-2) if single else weights
    scaled = rows * factors.unsqueeze(-2)  # w_j gamma(v_j), Chimera Eq. 8
    total = scaled.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("weights must have a positive sum over the real points of every row")
    midpoint = (scaled / total) @ points_klein
    return midpoint.squeeze(-2) if single else midpoint


# ------------------------------------------------------------------------ attention


@float32_under_autocast
def lorentz_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    masks: Tensor | None = None,
    *,
    beta: float | Tensor,
    offset: float | Tensor,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Hyperbolic attention of Chimera Eq. 8 on the hyperboloid.

        alpha_ij = sigmoid(-beta d_L(q_i, k_j) - c)
        r_i      = Einstein midpoint of the values v_j in the Klein model with weights
                   alpha_ij gamma(v_j) / sum_l alpha_il gamma(v_l)

    (``offset`` is the paper's c.) The paper's r_i is a Klein point; we return it on
    the hyperboloid, like the inputs. The normalised weights are computed as a softmax
    of log sigmoid(...) + log gamma(v_j), which equals the ratio above but cannot
    turn into 0 / 0 when every alpha underflows (far keys), and gamma(v_j) is taken as
    x_0 of the value (exact on the hyperboloid). Distances and aggregation run in
    float64 (see the module docstring); a result within eps of the Klein boundary is
    placed at radius ~18.7.

    Args:
        queries: (..., Q, n + 1) points on the hyperboloid.
        keys: (..., N, n + 1) points; leading dims broadcast with those of ``queries``.
        values: (..., N, m + 1) points (m may differ from n).
        masks: optional (..., N) bool key mask, True = a real token. Padded keys get
            weight 0 and their content is never read; every row needs a real key.
            (Padded queries only affect their own output row.)
        beta: scale of the distance (a number or a tensor broadcastable to (..., Q, N)).
        offset: the shift c (same forms as ``beta``).
        return_weights: also return alpha.

    Returns:
        (..., Q, m + 1) points on the hyperboloid; with ``return_weights`` also the
        (..., Q, N) weights alpha (0 at padded keys), in the promoted input dtype.
    """
    check_hyperboloid_points(queries, "queries", min_dim=2)
    check_float_tensor(keys, "keys", min_dim=2)
    check_float_tensor(values, "values", min_dim=2)
    if keys.shape[-1] != queries.shape[-1]:
        raise ValueError(
            f"queries have {queries.shape[-1]} coordinates but keys have {keys.shape[-1]}"
        )
    if keys.shape[:-1] != values.shape[:-1]:
        raise ValueError(
            f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must agree in all "
            "dims but the last"
        )
    _broadcast("queries", queries.shape[:-2], "keys", keys.shape[:-2])
    key_mask = None if masks is None else check_mask(masks, keys.shape[:-1], "masks")
    check_hyperboloid_points(keys, "keys", mask=key_mask)
    check_hyperboloid_points(values, "values", mask=key_mask)
    real_times = values[..., 0] if key_mask is None else values[..., 0][key_mask]
    if bool((real_times <= 0).any()):
        raise ValueError("values must have a positive time coordinate x_0 (upper sheet)")

    out_dtype = torch.promote_types(torch.promote_types(queries.dtype, keys.dtype), values.dtype)
    queries = queries.to(_WORK_DTYPE)
    keys = keys.to(_WORK_DTYPE)
    values = values.to(_WORK_DTYPE)
    if key_mask is not None:  # padded keys and values become the origin: never read
        real = key_mask.unsqueeze(-1)
        keys = torch.where(real, keys, _origin(keys.shape[-1], keys.device))
        values = torch.where(real, values, _origin(values.shape[-1], values.device))
    beta = _as_work_tensor(beta, "beta", queries)
    offset = _as_work_tensor(offset, "offset", queries)

    scores = -beta * _pairwise_distance(queries, keys) - offset  # Chimera Eq. 8
    value_times = values[..., 0]
    logits = torch.nn.functional.logsigmoid(scores) + torch.log(value_times).unsqueeze(-2)
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask.unsqueeze(-2), -math.inf)
    normalised = torch.softmax(logits, dim=-1)  # alpha gamma / sum alpha gamma
    values_klein = values[..., 1:] / value_times.unsqueeze(-1)
    result = _klein_to_lorentz(normalised @ values_klein).to(out_dtype)
    if not return_weights:
        return result
    weights = torch.sigmoid(scores)
    if key_mask is not None:
        weights = weights.masked_fill(~key_mask.unsqueeze(-2), 0.0)
    return result, weights.to(out_dtype)
