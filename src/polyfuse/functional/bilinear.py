"""Bilinear attention: the attention map and joint representation of BAN.

J.-H. Kim, J. Jun, B.-T. Zhang. "Bilinear Attention Networks." NeurIPS 2018.

Legend for shapes: ``B`` batch, ``T_x`` number of channels of the first input,
``T_y`` of the second, ``d_x`` and ``d_y`` their feature sizes, ``K'`` the rank of the attention
(BAN uses K' = 3K), ``K`` the rank of the joint representation, ``G`` the number
of glimpses.

The paper writes inputs as columns, X in R^{N x rho} (the question: rho words) and
Y in R^{M x phi} (the image: phi objects); the functions below are written for a
generic pair (x, y) with x = X^T and y = Y^T, rows of shape (T_x, d_x) and (T_y, d_y).
The reference VQA code, and :class:`polyfuse.nn.BAN`, pass the image first: there
x = Y^T (phi objects) and y = X^T (rho words). A weight is stored as in
:func:`torch.nn.functional.linear`, i.e. ``x_weight`` is U^T of shape (K', d_x).
With the ReLU of section 5.3 the two halves of BAN are

    logits_g[i, j] = p_g^T ( relu(U^T x_i) o relu(V^T y_j) )          (Eq. 9, 10, 13)
    A_g = softmax over all (i, j) of logits_g                          (Eq. 8, 10)
    f'_k = sum_{i, j} A[i, j] relu(U'^T x_i)_k relu(V'^T y_j)_k        (Eq. 6, 12)

One softmax covers the whole T_x x T_y map of a glimpse (note 8 of the papers'
README); a padded pair gets logit -inf and therefore attention exactly 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from polyfuse._checks import check_dropout, check_finite, check_mask, check_values
from polyfuse._precision import float32_under_autocast

__all__ = [
    "bilinear_attention_logits",
    "bilinear_attention_map",
    "bilinear_attention_pooling",
    "bilinear_logits_of_features",
    "bilinear_pooling_of_features",
    "bilinear_residual_glimpses",
]


# ---------------------------------------------------------------------------
# Validation helpers (private)
# ---------------------------------------------------------------------------


def _check_sequence(tensor: Tensor, name: str, owner: str) -> None:
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{owner}: {name} must be a tensor, got {type(tensor).__name__}")
    if tensor.dim() != 3:
        raise ValueError(
            f"{owner}: {name} must have shape (B, T_{name}, d_{name}), got {tuple(tensor.shape)}"
        )
    if not tensor.is_floating_point():
        raise ValueError(f"{owner}: {name} has dtype {tensor.dtype}; expected a float tensor")
    if tensor.shape[1] == 0:
        raise ValueError(f"{owner}: {name} is an empty sequence (T_{name} = 0)")


def _check_mask(mask: Tensor | None, tensor: Tensor, name: str, owner: str) -> Tensor:
    """A (B, T) bool mask for ``tensor`` (B, T, d): all True when ``mask`` is None."""
    if mask is None:
        return torch.ones(tensor.shape[:2], dtype=torch.bool, device=tensor.device)
    return check_mask(mask, tensor.shape[:2], f"{owner}: {name}")


def _check_pair(
    x: Tensor, y: Tensor, x_mask: Tensor | None, y_mask: Tensor | None, owner: str
) -> tuple[Tensor, Tensor]:
    """Validate the two inputs and their masks; return full (B, T_x) and (B, T_y) masks."""
    _check_sequence(x, "x", owner)
    _check_sequence(y, "y", owner)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{owner}: x has batch size {x.shape[0]} but y has {y.shape[0]}")
    if x.dtype != y.dtype:
        raise ValueError(f"{owner}: x has dtype {x.dtype} but y has {y.dtype}")
    x_mask = _check_mask(x_mask, x, "x_mask", owner)
    y_mask = _check_mask(y_mask, y, "y_mask", owner)
    check_finite(x, f"{owner}: x", x_mask)
    check_finite(y, f"{owner}: y", y_mask)
    return x_mask, y_mask


def _check_projection(
    weight: Tensor, bias: Tensor | None, in_features: int, name: str, owner: str
) -> None:
    """``weight`` (rank, in_features) and ``bias`` None or (rank,), finite."""
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(
            f"{owner}: {name}_weight must have shape (rank, {in_features}), got {shape}"
        )
    if weight.shape[1] != in_features:
        raise ValueError(
            f"{owner}: {name}_weight has shape {tuple(weight.shape)}, but {name} has feature "
            f"size {in_features} (expected (rank, {in_features}))"
        )
    check_finite(weight, f"{owner}: {name}_weight")
    if bias is not None:
        if not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(
                f"{owner}: {name}_bias must have shape ({weight.shape[0]},), got {shape}"
            )
        check_finite(bias, f"{owner}: {name}_bias")


def _project(x: Tensor, mask: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """relu(W x + b) of the real steps, (B, T, d) -> (B, T, rank) (BAN Eq. 12, 13).

    Padded steps are zeroed before the projection so that whatever they hold
    (even NaN) cannot reach the result; the caller gives them zero weight.
    """
    x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
    return F.relu(F.linear(x, weight, bias))


# ---------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------


def bilinear_attention_logits(
    x: Tensor,
    y: Tensor,
    x_weight: Tensor,
    y_weight: Tensor,
    glimpse_weight: Tensor,
    *,
    x_bias: Tensor | None = None,
    y_bias: Tensor | None = None,
    glimpse_bias: Tensor | None = None,
    x_mask: Tensor | None = None,
    y_mask: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Logits of the bilinear attention maps of all glimpses (BAN Eq. 10 with Eq. 13).

    ``logits[b, g, i, j] = p_g^T (relu(U^T x_i + u) o relu(V^T y_j + v)) + c_g``:
    low-rank bilinear pooling of every pair of channels (Eq. 9) with the ReLU of
    section 5.3; U and V are shared by all glimpses, p_g is one row of
    ``glimpse_weight`` per glimpse.

    Args:
        x: (B, T_x, d_x), the first input (X^T; BAN's VQA code passes the image Y^T here).
        y: (B, T_y, d_y), the second input (Y^T; BAN's VQA code passes the question X^T here).
        x_weight: U^T, shape (K', d_x).
        y_weight: V^T, shape (K', d_y).
        glimpse_weight: the vectors p_g stacked, shape (G, K').
        x_bias: None or (K',), added before the ReLU of the x side.
        y_bias: None or (K',), added before the ReLU of the y side.
        glimpse_bias: None or (G,), one constant per glimpse (the reference code's
            ``h_bias``); it shifts a whole map and cancels in its softmax.
        x_mask: None or (B, T_x) bool, True at real channels of x.
        y_mask: None or (B, T_y) bool, True at real channels of y.
        dropout: dropout probability on relu(U^T x) (the reference code's attention
            dropout), applied only when ``training`` is True.
        training: apply ``dropout``.

    Returns:
        (B, G, T_x, T_y) logits; pairs with a padded x or y channel hold -inf.

    Raises:
        ValueError: wrong shapes or dtypes, NaN/Inf at a real channel or in a
            weight, a sample whose x or y is all padding.
    """
    owner = "bilinear_attention_logits"
    x_mask_given, y_mask_given = x_mask, y_mask
    x_mask, y_mask = _check_pair(x, y, x_mask, y_mask, owner)
    _check_projection(x_weight, x_bias, x.shape[-1], "x", owner)
    _check_projection(y_weight, y_bias, y.shape[-1], "y", owner)
    rank = x_weight.shape[0]
    if y_weight.shape[0] != rank:
        raise ValueError(
            f"{owner}: x_weight has rank {rank} but y_weight has rank {y_weight.shape[0]}; "
            "both project onto the same K' features"
        )
    if not isinstance(glimpse_weight, Tensor) or glimpse_weight.dim() != 2:
        raise ValueError(f"{owner}: glimpse_weight must have shape (G, {rank})")
    if glimpse_weight.shape[1] != rank or glimpse_weight.shape[0] == 0:
        raise ValueError(
            f"{owner}: glimpse_weight has shape {tuple(glimpse_weight.shape)}, expected "
            f"(G, {rank}) with G >= 1"
        )
    check_finite(glimpse_weight, f"{owner}: glimpse_weight")
    glimpses = glimpse_weight.shape[0]
    if glimpse_bias is not None:
        if not isinstance(glimpse_bias, Tensor) or tuple(glimpse_bias.shape) != (glimpses,):
            raise ValueError(f"{owner}: glimpse_bias must have shape ({glimpses},)")
        check_finite(glimpse_bias, f"{owner}: glimpse_bias")
    check_dropout(dropout, owner)

    # The padded steps are not zeroed: a logit depends on its own x and y step only, and
    # every pair with a padded step is set to -inf below, whatever it held (NaN included).
    x_features = F.relu(F.linear(x, x_weight, x_bias))  # relu(X^T U): (B, T_x, K'), Eq. 13
    x_features = F.dropout(x_features, dropout, training)
    y_features = F.relu(F.linear(y, y_weight, y_bias))  # relu(V^T Y)^T: (B, T_y, K'), Eq. 13
    logits = bilinear_logits_of_features(x_features, y_features, glimpse_weight)
    if glimpse_bias is not None:
        logits = logits + glimpse_bias[None, :, None, None]
    if x_mask_given is None and y_mask_given is None:
        return logits
    pair_mask = x_mask.unsqueeze(-1) & y_mask.unsqueeze(1)  # (B, T_x, T_y), True at real pairs
    return logits.masked_fill(~pair_mask.unsqueeze(1), float("-inf"))  # BAN section 5.2: mask with -inf


def bilinear_logits_of_features(x_features: Tensor, y_features: Tensor, glimpse_weight: Tensor) -> Tensor:
    """BAN Eq. 10 on projected features: ``logits[b, g, i, j] = p_g^T (x_features[b, i] o y_features[b, j])``.

    The core of :func:`bilinear_attention_logits` without its checks, biases and masks.

    Args:
        x_features: (B, T_x, K'), relu(X^T U).
        y_features: (B, T_y, K'), relu(V^T Y)^T.
        glimpse_weight: (G, K'), the vectors p_g stacked.

    Returns:
        (B, G, T_x, T_y) logits.
    """
    # ((1 p_g^T) o relu(X^T U)) relu(V^T Y): the Hadamard product with p_g is put on the
    # shorter sequence, which keeps the (B, G, T, K') intermediate small; one batched
    # product per sample over all glimpses (no copy of the other side per glimpse).
    weights = glimpse_weight.unsqueeze(1)  # (G, 1, K'), broadcast over (B, G, T, K')
    batch, length_x, length_y = x_features.shape[0], x_features.shape[1], y_features.shape[1]
    glimpses = glimpse_weight.shape[0]
    if length_y <= length_x:
        weighted_y = (y_features.unsqueeze(1) * weights).flatten(1, 2)  # (B, G T_y, K')
        logits = torch.bmm(x_features, weighted_y.transpose(1, 2))  # (B, T_x, G T_y)
        return logits.view(batch, length_x, glimpses, length_y).transpose(1, 2)
    weighted_x = (x_features.unsqueeze(1) * weights).flatten(1, 2)  # (B, G T_x, K')
    logits = torch.bmm(weighted_x, y_features.transpose(1, 2))  # (B, G T_x, T_y)
    return logits.view(batch, glimpses, length_x, length_y)


@float32_under_autocast
def bilinear_attention_map(
    logits: Tensor, *, x_mask: Tensor | None = None, y_mask: Tensor | None = None
) -> Tensor:
    """Softmax over the whole T_x x T_y map of each glimpse (BAN Eq. 8, 10).

    Args:
        logits: (B, G, T_x, T_y), e.g. from :func:`bilinear_attention_logits`;
            -inf marks a pair that gets no attention.
        x_mask: None or (B, T_x) bool, True at real channels; pairs with a padded
            x channel are set to -inf first.
        y_mask: None or (B, T_y) bool, the same for y.

    Returns:
        (B, G, T_x, T_y) attention maps: each (b, g) map sums to 1 over the real
        pairs and is exactly 0 on padded ones. Under ``torch.autocast`` the softmax
        (its exponentials and denominator) computes in float32 and the maps are float32.

    Raises:
        ValueError: wrong shape, NaN or +Inf in ``logits``, a mask that is all
            padding, or a map in which every pair is -inf.
    """
    owner = "bilinear_attention_map"
    if not isinstance(logits, Tensor) or logits.dim() != 4 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"{owner}: logits must be a float tensor (B, G, T_x, T_y), got {shape}")
    batch, _, length_x, length_y = logits.shape
    checked = check_values(logits)
    flat = logits.flatten(start_dim=2)  # (B, G, T_x * T_y): one softmax per whole map
    masked = x_mask is not None or y_mask is not None
    if checked:
        _check_logits(flat, owner, maps_may_be_empty=masked)  # before the masks hide a NaN
    if masked:
        if x_mask is not None:
            x_mask = _check_mask(x_mask, logits.new_empty(batch, length_x, 0), "x_mask", owner)
            logits = logits.masked_fill(~x_mask[:, None, :, None], float("-inf"))
        if y_mask is not None:
            y_mask = _check_mask(y_mask, logits.new_empty(batch, length_y, 0), "y_mask", owner)
            logits = logits.masked_fill(~y_mask[:, None, None, :], float("-inf"))
        flat = logits.flatten(start_dim=2)
        if checked:
            _check_logits(flat, owner)  # the masks may leave a map without a finite logit
    return torch.softmax(flat, dim=-1).view_as(logits)


def _check_logits(flat: Tensor, owner: str, *, maps_may_be_empty: bool = False) -> None:
    """No NaN or +Inf in ``flat`` (B, G, N), and (unless ``maps_may_be_empty``) a finite
    logit in every map.

    One reduction and one host read when all is well: the largest logit of a map
    (``amax`` propagates NaN) is NaN if the map holds a NaN, else +Inf if it holds +Inf,
    else -Inf if every logit is -Inf, and finite exactly when the map is fine.
    """
    peak = flat.amax(dim=-1)  # (B, G)
    if bool((peak * 0 == 0).all()):  # x * 0 is 0 for a finite x, NaN for an infinite or NaN one
        return
    if bool(torch.isnan(peak).any()) or bool((peak == float("inf")).any()):
        raise ValueError(f"{owner}: logits contain NaN or +Inf")
    if not maps_may_be_empty:
        raise ValueError(f"{owner}: a glimpse's map has no finite logit (every pair is -inf)")


def bilinear_attention_pooling(
    x: Tensor,
    y: Tensor,
    attention: Tensor,
    x_weight: Tensor,
    y_weight: Tensor,
    *,
    x_bias: Tensor | None = None,
    y_bias: Tensor | None = None,
    x_mask: Tensor | None = None,
    y_mask: Tensor | None = None,
    pool: int = 1,
) -> Tensor:
    """Joint representation f' of two sequences under a bilinear attention map (BAN Eq. 12).

    ``f'_k = sum_{i, j} A[i, j] relu(U'^T x_i + u)_k relu(V'^T y_j + v)_k``, i.e.
    ``relu(X^T U')_k^T A relu(Y^T V')_k`` (Eq. 5, 6 with the ReLU of Eq. 12); with
    ``pool > 1`` consecutive groups of ``pool`` features are then summed (the
    reference code's sum pooling ``AvgPool1d(pool) * pool``).

    Args:
        x: (B, T_x, d_x), the first input.
        y: (B, T_y, d_y), the second input.
        attention: (B, T_x, T_y) one map, or (B, G, T_x, T_y) one map per glimpse.
        x_weight: U'^T, shape (K * pool, d_x).
        y_weight: V'^T, shape (K * pool, d_y).
        x_bias: None or (K * pool,).
        y_bias: None or (K * pool,).
        x_mask: None or (B, T_x) bool, True at real channels of x.
        y_mask: None or (B, T_y) bool, True at real channels of y. Pairs with a
            padded channel get zero weight whatever ``attention`` holds there.
        pool: size of the sum pooling over features, a divisor of the rank.

    Returns:
        (B, K), or (B, G, K) for a 4-d ``attention``.

    Raises:
        ValueError: wrong shapes or dtypes, NaN/Inf at a real channel, in a weight
            or at a real pair of ``attention``, a sample that is all padding, or a
            ``pool`` that does not divide the rank.
    """
    owner = "bilinear_attention_pooling"
    x_mask, y_mask = _check_pair(x, y, x_mask, y_mask, owner)
    _check_projection(x_weight, x_bias, x.shape[-1], "x", owner)
    _check_projection(y_weight, y_bias, y.shape[-1], "y", owner)
    rank = x_weight.shape[0]
    if y_weight.shape[0] != rank:
        raise ValueError(
            f"{owner}: x_weight has rank {rank} but y_weight has rank {y_weight.shape[0]}"
        )
    if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1 or rank % pool:
        raise ValueError(f"{owner}: pool must be a positive divisor of the rank {rank}, got {pool}")
    batch, length_x, length_y = x.shape[0], x.shape[1], y.shape[1]
    if not isinstance(attention, Tensor) or attention.dim() not in (3, 4):
        raise ValueError(f"{owner}: attention must have shape (B, T_x, T_y) or (B, G, T_x, T_y)")
    if (attention.shape[0], *attention.shape[-2:]) != (batch, length_x, length_y):
        raise ValueError(
            f"{owner}: attention has shape {tuple(attention.shape)}, but x and y give "
            f"(B, T_x, T_y) = {(batch, length_x, length_y)}"
        )
    if attention.dtype != x.dtype:
        raise ValueError(f"{owner}: attention has dtype {attention.dtype} but x has {x.dtype}")
    single = attention.dim() == 3
    if single:
        attention = attention.unsqueeze(1)  # (B, 1, T_x, T_y)
    pair_mask = x_mask[:, None, :, None] & y_mask[:, None, None, :]  # (B, 1, T_x, T_y)
    if check_values(attention) and bool((~torch.isfinite(attention) & pair_mask).any()):
        raise ValueError(f"{owner}: attention contains NaN or Inf at a real (x, y) pair")
    attention = attention.masked_fill(~pair_mask, 0.0)

    x_features = _project(x, x_mask, x_weight, x_bias)  # relu(X^T U'): (B, T_x, rank)
    y_features = _project(y, y_mask, y_weight, y_bias)  # relu(Y^T V'): (B, T_y, rank)
    joint = bilinear_pooling_of_features(x_features, y_features, attention, pool=pool)
    return joint.squeeze(1) if single else joint


def bilinear_pooling_of_features(
    x_features: Tensor, y_features: Tensor, attention: Tensor, *, pool: int = 1
) -> Tensor:
    """BAN Eq. 12 on projected features: ``f'_k = x_features[:, :, k]^T A y_features[:, :, k]``.

    The core of :func:`bilinear_attention_pooling` without its checks and masking, for
    callers whose features are finite and whose ``attention`` is already 0 at padded
    pairs (a map from :func:`bilinear_attention_map`), so that padded steps add nothing.

    Args:
        x_features: (B, T_x, R), relu(X^T U').
        y_features: (B, T_y, R), relu(Y^T V').
        attention: (B, T_x, T_y) or (B, G, T_x, T_y).
        pool: sum pooling over consecutive groups of ``pool`` features (R = K * pool).

    Returns:
        (B, K), or (B, G, K) for a 4-d ``attention``.
    """
    single = attention.dim() == 3
    if single:
        attention = attention.unsqueeze(1)
    rank = x_features.shape[-1]
    # One product per sample for all glimpses: (B, G T_x, T_y) @ (B, T_y, R).
    attended_y = torch.bmm(attention.flatten(1, 2), y_features).view(*attention.shape[:3], rank)
    joint = (x_features.unsqueeze(1) * attended_y).sum(dim=-2)  # (B, G, R)
    if pool > 1:
        joint = joint.unflatten(-1, (rank // pool, pool)).sum(dim=-1)  # (B, G, K)
    return joint.squeeze(1) if single else joint


def bilinear_residual_glimpses(
    x_features: Tensor,
    y: Tensor,
    attention: Tensor,
    y_weight: Tensor,
    y_bias: Tensor,
    projection_weight: Tensor,
    projection_bias: Tensor,
    *,
    pool: int = 1,
    one_product: bool | None = None,
) -> Tensor:
    """BAN's residual learning of attention (Eq. 11 with Eq. 12) over G glimpses, no dropout.

    For g = 1..G, f'_g is Eq. 12 of x and the current stream y_g under map A_g (with U'_g,
    V'_g), and ``y_{g+1} = y_g + (P_g^T f'_g + p_g) 1^T`` (Eq. 11). The update adds the same
    vector to every token, so ``y_g = y + 1 r_g^T`` with ``r_1 = 0`` and
    ``r_{g+1} = r_g + P_g^T f'_g + p_g``, and Eq. 12 splits into

        relu(V'_g^T (y_j + r_g) + v'_g) = relu(V'_g^T y_j + v'_g + V'_g^T r_g)
        f'_g,k = sum_j relu(...)_jk z_g,jk  with  z_g = A_g^T relu(X^T U'_g)  (T_y x R)

    The products V'_g^T y_j and z_g of all glimpses are one batched product each before the
    loop over glimpses, which is left with (B, d_y)-sized products: the (B, T_y, d_y) stream
    is never rebuilt. The core of :class:`polyfuse.nn.BAN` in evaluation (or without dropout),
    without checks.

    Args:
        x_features: (B, T_x, G, R), relu(U'_g^T x_i + u'_g) of every glimpse; finite at
            padded steps too (they get zero attention, but 0 * NaN is NaN).
        y: (B, T_y, d_y), the stream before the first glimpse, finite.
        attention: (B, G, T_x, T_y) maps that are 0 at padded pairs (as from
            :func:`bilinear_attention_map`).
        y_weight: V'_g^T stacked, (G, R, d_y).
        y_bias: v'_g stacked, (G, R).
        projection_weight: P_g^T stacked, (G, d_y, K), with R = K * pool.
        projection_bias: p_g stacked, (G, d_y).
        pool: sum pooling over consecutive groups of ``pool`` features of f'_g.
        one_product: z_g of all glimpses in one product over a (B G, T_x, R) copy of
            x_features (True) or one product per glimpse on its strided slice (False);
            None: one product on CUDA (one launch instead of G), per glimpse elsewhere
            (no copy; faster on the CPU, `scripts/bench_ban_paths.py`; the CUDA choice is
            not measured: no GPU was lent to the session that measured the CPU's).

    Returns:
        r_{G+1}, (B, 1, d_y): the stream after the last glimpse is ``y + r``.
    """
    batch, glimpses, rank = x_features.shape[0], x_features.shape[2], x_features.shape[3]
    length_y = y.shape[1]
    # z_g = A_g^T relu(X^T U'_g) of every glimpse, (B, T_y, R) each.
    if x_features.is_cuda if one_product is None else one_product:
        length_x = x_features.shape[1]
        x_by_glimpse = x_features.transpose(1, 2).reshape(batch * glimpses, length_x, rank)
        maps = attention.reshape(batch * glimpses, length_x, length_y).transpose(1, 2)
        attended_x = torch.bmm(maps, x_by_glimpse).view(batch, glimpses, length_y, rank).unbind(1)
    else:
        maps = attention.transpose(-1, -2).unbind(1)  # G x (B, T_y, T_x)
        attended_x = [torch.bmm(a, x) for a, x in zip(maps, x_features.unbind(2), strict=True)]
    # V'_g^T y_j + v'_g of all glimpses in one product: (B, T_y, G, R).
    y_projected = F.linear(y, y_weight.flatten(0, 1), y_bias.flatten()).view(batch, length_y, glimpses, rank)
    # The loop works on (B, d_y) rows with 2-d products against each glimpse's weights: the
    # weights' gradients are then one (R, d_y) product each, never a per-sample (B, R, d_y)
    # tensor (a batched product with weights expanded over the batch builds those in its
    # backward, 2 GB at the VQA size).
    y_weights = y_weight.transpose(1, 2).unbind(0)  # G x (d_y, R): V'_g
    projections = projection_weight.transpose(1, 2).unbind(0)  # G x (K, d_y): P_g
    y_projected, biases = y_projected.unbind(2), projection_bias.unbind(0)
    residual = None  # r_g, (B, d_y); r_1 = 0
    for glimpse in range(glimpses):
        y_features = y_projected[glimpse]  # V'_g^T y_j + v'_g, (B, T_y, R)
        if residual is not None:
            y_features = y_features + torch.mm(residual, y_weights[glimpse]).unsqueeze(1)  # + V'_g^T r_g
        # f'_g = sum_j relu(V'_g^T y_g,j + v'_g) o z_g,j: (B, R), BAN Eq. 12
        joint = (attended_x[glimpse] * F.relu(y_features)).sum(dim=1)
        if pool > 1:
            joint = joint.unflatten(-1, (rank // pool, pool)).sum(dim=-1)  # (B, K)
        # BAN Eq. 11: r_{g+1} = r_g + p_g + P_g^T f'_g
        start = biases[glimpse] if residual is None else residual + biases[glimpse]
        residual = torch.addmm(start, joint, projections[glimpse])
    return residual.unsqueeze(1)
