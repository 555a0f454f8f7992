"""Bilinear attention network (BAN, Kim, Jun and Zhang, NeurIPS 2018) as a fusion module.

Legend for shapes: ``B`` batch, ``T_x`` and ``T_y`` the lengths of the two inputs,
``d_x`` and ``d_y`` their feature sizes, ``K`` the rank of the joint representation
(``hidden_dim``), ``K'`` the rank of the attention (``attention_rank``, k * K by
default), ``G`` the number of glimpses.

The layout follows the authors' code (github.com/jnhwkim/ban-vqa, ``BanModel`` with
``BiAttention``, ``BCNet`` and ``FCNet``). In the paper's notation (section 3, sizes of
section 5.4) X in R^{N x rho} is the question (rho words) and Y in R^{M x phi} the
image (phi objects); the reference code passes the image first (``v``) and the question
second (``q``), and so does this module: x = Y^T, y = X^T. The residual stream of
Eq. 11 is the question X, i.e. the second input y here:

1. all G attention maps are computed once from the original inputs, with U and V
   shared by the glimpses and one vector p_g per glimpse (BAN Eq. 10, 13);
2. for g = 1..G: ``y <- y + P_g^T f'_g`` broadcast over the tokens of y, where f'_g
   is the joint representation of x and the current y under map g, with its own
   U'_g and V'_g (Eq. 11, 12);
3. the result is the final y summed over its real tokens, (B, d_y).

Every linear map is weight-normalised over the whole matrix (weight norm with
``dim=None``) as in the reference, and preceded by dropout. The per-glimpse maps U'_g,
V'_g and P_g are stored stacked (:class:`GlimpseLinears`), so that each side is one
batched product. Without dropout (evaluation, or ``dropout=0``) on CUDA (:func:`chain_on`)
the glimpse loop works on (B, d_y) vectors only: the update of Eq. 11 is the same for every token of y,
so y after glimpse g is y + r_g and V'_g^T (y_j + r_g) = V'_g^T y_j + V'_g^T r_g (see
:func:`polyfuse.functional.bilinear_residual_glimpses`). With dropout in training, which
draws a mask over the whole stream for each glimpse, the glimpses run one after the
other on the (B, T_y, d_y) stream as in the reference; on the CPU so do the glimpses
without dropout, which is faster there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations

from polyfuse._checks import check_dropout
from polyfuse.functional.bilinear import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_pooling_of_features,
    bilinear_residual_glimpses,
)
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.registry import register

__all__ = ["BAN", "GlimpseLinears", "weight_normed_linear"]


def weight_normed_linear(in_features: int, out_features: int, *, bias: bool = True) -> nn.Linear:
    """A linear layer with weight normalisation over the whole matrix (``dim=None``).

    ``weight = g * v / ||v||_F`` with a scalar g (``parametrizations.weight.original0``)
    and v of the weight's shape (``original1``), as ``FCNet`` of the reference code.
    """
    return parametrizations.weight_norm(nn.Linear(in_features, out_features, bias=bias), dim=None)


def _weights_of(linears: Sequence[nn.Linear]) -> list[Tensor]:
    """The weights ``g v / ||v||_F`` of layers made by :func:`weight_normed_linear`, all
    computed together (three foreach operations instead of three per layer); the values
    of reading each ``linear.weight``."""
    directions = [linear.parametrizations.weight.original1 for linear in linears]
    gains = [linear.parametrizations.weight.original0 for linear in linears]
    scales = torch._foreach_div(gains, torch._foreach_norm(directions))  # g / ||v||_F
    return list(torch._foreach_mul(directions, scales))


class _Glimpse(NamedTuple):
    """One glimpse's map of a :class:`GlimpseLinears`: its weight and bias; calling it applies them."""

    weight: Tensor
    bias: Tensor

    def __call__(self, tensor: Tensor) -> Tensor:
        return F.linear(tensor, self.weight, self.bias)


def chain_on(device: torch.device) -> bool:
    """Whether BAN without dropout runs the residual chain on (B, d_y) vectors
    (:func:`polyfuse.functional.bilinear_residual_glimpses`: fewer, larger launches) rather
    than the glimpse loop on the whole stream. On the CPU the loop is faster in
    forward+backward and equal in forward (`scripts/bench_ban_paths.py`, docs/BENCHMARKS.md
    "BAN's two paths"): the chain's large (B T_x, G R) intermediates are fresh pages on
    every call. On CUDA the chain is kept (not measured: no GPU lent to that session)."""
    return device.type == "cuda"


def _scaled_linear(x: Tensor, *, direction: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    return torch.addcmul(bias, F.linear(x, direction), scale)


class GlimpseLinears(nn.Module):
    """G weight-normalised linear maps of one shape, one per glimpse, stored stacked.

    ``weight[g] = weight_g[g] * weight_v[g] / ||weight_v[g]||_F``: each glimpse's matrix is
    normalised over the whole matrix, as ``weight_norm(nn.Linear(...), dim=None)`` of the
    reference's ``FCNet``, and the G weights come from one ``torch._weight_norm`` over dim 0.
    Parameters: ``weight_g`` (G, 1, 1) (the shape torch's weight norm gives the gain over
    dim 0), ``weight_v`` (G, out, in), ``bias`` (G, out); ``layers[g]`` is glimpse g's weight
    and bias (callable).
    """

    def __init__(self, glimpses: int, in_features: int, out_features: int) -> None:
        super().__init__()
        # nn.Linear's initialisation, glimpse after glimpse, and g = ||v||_F as weight_norm sets it.
        layers = [nn.Linear(in_features, out_features) for _ in range(glimpses)]
        direction = torch.stack([layer.weight.detach() for layer in layers])
        self.weight_g = nn.Parameter(torch.linalg.vector_norm(direction, dim=(1, 2), keepdim=True))
        self.weight_v = nn.Parameter(direction)
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))

    @property
    def weight(self) -> Tensor:
        """The G weights, (G, out, in)."""
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    def maps(self, count: int) -> list[Callable[[Tensor], Tensor]]:
        """The first ``count`` maps ``x -> weight[g] x + bias[g]``, split once (indexing the
        stack per glimpse would make the backward fill and add a zero tensor of the whole
        stack per glimpse: a third of a training step at the VQA size).

        Without gradients each map computes ``(g_g / ||v_g||_F) (v_g x) + bias[g]``: the gain
        scales the product instead of v_g, so the (G, out, in) weights are never built. With
        gradients the weights are built by the fused weight norm, whose backward is cheaper
        than autograd through a norm and a scaling (issue 40, profiled on the CPU)."""
        biases = self.bias.unbind(0)[:count]  # zip stops at the first count glimpses
        if torch.is_grad_enabled():
            return [partial(F.linear, weight=w, bias=b) for w, b in zip(self.weight.unbind(0), biases, strict=False)]
        scales = self.weight_g.flatten() / torch.linalg.vector_norm(self.weight_v, dim=(1, 2))
        parts = zip(self.weight_v.unbind(0), scales.unbind(0), biases, strict=False)
        return [partial(_scaled_linear, direction=v, scale=s, bias=b) for v, s, b in parts]

    def __len__(self) -> int:
        return self.weight_v.shape[0]

    def __getitem__(self, glimpse: int) -> _Glimpse:
        return _Glimpse(self.weight[glimpse], self.bias[glimpse])

    def extra_repr(self) -> str:
        glimpses, out_features, in_features = self.weight_v.shape
        return f"glimpses={glimpses}, in_features={in_features}, out_features={out_features}"


@register("ban")
class BAN(FusionModule):
    """Bilinear attention network over two sequences: ``[x, y] -> (B, out_dim)``.

    ``inputs[0]`` is x (BAN's Y^T, the image objects ``v`` of the reference code) and
    ``inputs[1]`` is y (BAN's X^T, the question words ``q``); masks may be given for
    both. The residual stream lives in y's feature space, so the fused vector has
    size d_y; when ``out_dim != input_dims[1]`` a final weight-normalised linear map
    (``output_projection``) takes it to ``out_dim``, and when they are equal there
    is none, which keeps :func:`polyfuse.interop.load_ban_fusion` exact.

    Args:
        input_dims: ``[d_x, d_y]``.
        out_dim: size of the output; ``d_y`` reproduces the reference exactly.
        hidden_dim: K, the rank of each glimpse's joint representation (BAN's C = K);
            defaults to ``out_dim``.
        glimpses: G, the number of attention maps and residual steps (8 as the
            reference's default ``--gamma``).
        k: the attention rank is K' = k * K (BAN section 5.4 uses 3).
        attention_rank: K' set directly, overriding ``k``.
        joint_pool: each joint representation has rank ``joint_pool * K`` before a
            sum pooling by ``joint_pool`` (the reference's ``BCNet(k=...)`` of
            ``b_net``; 1 in its ``build_ban``, which means no pooling).
        dropout: dropout before every linear map (the reference's 0.2).
        attention_dropout: dropout on relu(U^T x) inside the attention logits (the
            reference's 0.5).
    """

    min_modalities = 2
    max_modalities = 2

    def __init__(
        self,
        input_dims: Sequence[int],
        out_dim: int,
        *,
        hidden_dim: int | None = None,
        glimpses: int = 8,
        k: int = 3,
        attention_rank: int | None = None,
        joint_pool: int = 1,
        dropout: float = 0.2,
        attention_dropout: float = 0.5,
    ) -> None:
        super().__init__(input_dims, out_dim)
        x_dim, y_dim = self.input_dims
        hidden_dim = self.out_dim if hidden_dim is None else int(hidden_dim)
        if attention_rank is None:
            attention_rank = k * hidden_dim
        for name, value in [
            ("hidden_dim", hidden_dim),
            ("glimpses", glimpses),
            ("k", k),
            ("attention_rank", attention_rank),
            ("joint_pool", joint_pool),
        ]:
            if int(value) != value or value < 1:
                raise ValueError(f"BAN: {name} must be a positive integer, got {value}")
        self.hidden_dim = hidden_dim
        self.glimpses = int(glimpses)
        self.attention_rank = int(attention_rank)
        self.joint_pool = int(joint_pool)
        self.dropout = check_dropout(dropout, "BAN")
        self.attention_dropout = check_dropout(attention_dropout, "BAN", "attention_dropout")

        # Attention (BAN Eq. 10, 13): U, V shared by all glimpses, one row p_g per glimpse.
        self.attention_x = weight_normed_linear(x_dim, self.attention_rank)
        self.attention_y = weight_normed_linear(y_dim, self.attention_rank)
        glimpse_vectors = nn.Linear(self.attention_rank, self.glimpses, bias=False)
        nn.init.normal_(glimpse_vectors.weight)  # the reference draws h_mat from N(0, 1)
        # The reference's per-glimpse constant h_bias is left out: it shifts a whole
        # map and cancels in the softmax, so it could never receive a gradient.
        self.attention_glimpses = parametrizations.weight_norm(glimpse_vectors, dim=None)
        # Joint representation (BAN Eq. 12) and its projection P_g (Eq. 11): one map per
        # glimpse, stacked (G, out, in) so that each side is one batched product.
        joint_rank = self.joint_pool * hidden_dim
        self.joint_x = GlimpseLinears(self.glimpses, x_dim, joint_rank)  # U'_g^T, u'_g
        self.joint_y = GlimpseLinears(self.glimpses, y_dim, joint_rank)  # V'_g^T, v'_g
        self.joint_projections = GlimpseLinears(self.glimpses, hidden_dim, y_dim)  # P_g^T, p_g
        self.output_projection = (
            None if self.out_dim == y_dim else weight_normed_linear(y_dim, self.out_dim)
        )

    def _drop(self, tensor: Tensor) -> Tensor:
        return F.dropout(tensor, self.dropout, self.training)

    def attention_maps(
        self, x: Tensor, y: Tensor, x_mask: Tensor | None = None, y_mask: Tensor | None = None
    ) -> Tensor:
        """The G bilinear attention maps, (B, G, T_x, T_y) (BAN Eq. 8, 10, 13).

        ``x`` (B, T_x, d_x), ``y`` (B, T_y, d_y), masks None or (B, T_x) and (B, T_y)
        bool (True = real step); padded pairs get attention 0.
        """
        weights = _weights_of([self.attention_x, self.attention_y, self.attention_glimpses])
        return self._attention_maps(x, y, x_mask, y_mask, *weights)

    def _attention_maps(
        self,
        x: Tensor,
        y: Tensor,
        x_mask: Tensor | None,
        y_mask: Tensor | None,
        x_weight: Tensor,
        y_weight: Tensor,
        glimpse_weight: Tensor,
    ) -> Tensor:
        """:meth:`attention_maps` with the weights U^T, V^T and the p_g already computed."""
        logits = bilinear_attention_logits(
            self._drop(x),
            self._drop(y),
            x_weight,
            y_weight,
            glimpse_weight if len(glimpse_weight) == self.glimpses else glimpse_weight[: self.glimpses],
            x_bias=self.attention_x.bias,
            y_bias=self.attention_y.bias,
            x_mask=x_mask,
            y_mask=y_mask,
            dropout=self.attention_dropout,
            training=self.training,
        )
        return bilinear_attention_map(logits)

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self._fuse(inputs, masks, details=False).fused

    def fuse_details(self, inputs: list[Tensor], masks: list[Tensor]) -> FusionOutput:
        """Fused output, sequences [x, the residual stream of y after the last glimpse
        (Eq. 14)] and the G attention maps (B, G, T_x, T_y)."""
        return self._fuse(inputs, masks, details=True)

    def _fuse(self, inputs: list[Tensor], masks: list[Tensor], *, details: bool) -> FusionOutput:
        x, y = inputs
        x_mask, y_mask = masks
        # The 2-d weight-normalised weights, all at once: U^T, V^T, the p_g and the output map.
        layers = [self.attention_x, self.attention_y, self.attention_glimpses]
        if self.output_projection is not None:
            layers.append(self.output_projection)
        weights = _weights_of(layers)
        attention = self._attention_maps(x, y, x_mask, y_mask, *weights[:3])  # 0 at padded pairs
        if (self.training and self.dropout > 0) or not chain_on(x.device):
            stream = self._glimpse_loop(x, y, attention)
            # Sum over the real tokens of y (the reference's q_emb.sum(1)), (B, d_y).
            fused = stream.masked_fill(~y_mask.unsqueeze(-1), 0.0).sum(dim=1)
        else:
            x_weight, x_bias = self._stacked(self.joint_x)
            # relu(U'_g^T x + u'_g) of all glimpses in one product, (B, T_x, G, rank); x and y
            # are zero at padded steps on entry.
            x_features = F.relu(F.linear(x, x_weight.flatten(0, 1), x_bias.flatten()))
            residual = bilinear_residual_glimpses(  # BAN Eq. 11, 12: y + r after the last glimpse
                x_features.unflatten(-1, (self.glimpses, -1)),
                y,
                attention,
                *self._stacked(self.joint_y),
                *self._stacked(self.joint_projections),
                pool=self.joint_pool,
            )  # (B, 1, d_y)
            stream = y + residual if details else None
            # Sum over the real tokens of y + r (the reference's q_emb.sum(1)): y is zero at
            # padded steps and r counts once per real token. (B, d_y)
            real_tokens = y_mask.sum(dim=1, keepdim=True, dtype=y.dtype)  # (B, 1)
            fused = torch.addcmul(y.sum(dim=1), real_tokens, residual.squeeze(1))
        if self.output_projection is not None:
            fused = F.linear(fused, weights[3], self.output_projection.bias)
        return FusionOutput(fused, [x, stream] if details else None, attention)

    def _stacked(self, layers: GlimpseLinears) -> tuple[Tensor, Tensor]:
        """(weight, bias) of the first ``self.glimpses`` maps of ``layers``."""
        weight, bias = layers.weight, layers.bias
        if len(layers) > self.glimpses:  # the glimpses were reduced after construction
            weight, bias = weight[: self.glimpses], bias[: self.glimpses]
        return weight, bias

    def _glimpse_loop(self, x: Tensor, y: Tensor, attention: Tensor) -> Tensor:
        """The residual stream after the last glimpse, (B, T_y, d_y), one glimpse after the
        other with its own dropout on x, on the stream and on f'_g, in the reference's
        order of random draws (BAN Eq. 11, 12)."""
        joint_x, joint_y, projections = (layers.maps(self.glimpses) for layers in (
            self.joint_x, self.joint_y, self.joint_projections))
        stream = y  # the residual stream, (B, T_y, d_y)
        for glimpse in range(self.glimpses):
            x_features = F.relu(joint_x[glimpse](self._drop(x)))
            y_features = F.relu(joint_y[glimpse](self._drop(stream)))
            # f'_g: (B, K), BAN Eq. 12. Padded steps were zeroed on entry and the map is 0
            # at padded pairs, so padded steps add nothing.
            joint = bilinear_pooling_of_features(
                x_features, y_features, attention[:, glimpse], pool=self.joint_pool
            )
            # BAN Eq. 11 (on y, as the reference code): y <- P_g^T f'_g 1^T + y
            step = projections[glimpse](self._drop(joint))
            stream = stream + step.unsqueeze(1)
        return stream

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, hidden_dim={self.hidden_dim}, glimpses={self.glimpses}, "
            f"attention_rank={self.attention_rank}, joint_pool={self.joint_pool}, "
            f"dropout={self.dropout}, attention_dropout={self.attention_dropout}"
        )
