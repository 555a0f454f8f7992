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
``dim=None``) as in the reference, and preceded by dropout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations

from polyfuse._checks import check_dropout
from polyfuse.functional.bilinear import (
    bilinear_attention_logits,
    bilinear_attention_map,
    bilinear_pooling_of_features,
)
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.registry import register

__all__ = ["BAN"]


def _weight_normed_linear(in_features: int, out_features: int, *, bias: bool = True) -> nn.Linear:
    """A linear layer with weight normalisation over the whole matrix (``dim=None``).

    ``weight = g * v / ||v||_F`` with a scalar g (``parametrizations.weight.original0``)
    and v of the weight's shape (``original1``), as ``FCNet`` of the reference code.
    """
    return parametrizations.weight_norm(nn.Linear(in_features, out_features, bias=bias), dim=None)


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
        self.attention_x = _weight_normed_linear(x_dim, self.attention_rank)
        self.attention_y = _weight_normed_linear(y_dim, self.attention_rank)
        glimpse_vectors = nn.Linear(self.attention_rank, self.glimpses, bias=False)
        nn.init.normal_(glimpse_vectors.weight)  # the reference draws h_mat from N(0, 1)
        # The reference's per-glimpse constant h_bias is left out: it shifts a whole
        # map and cancels in the softmax, so it could never receive a gradient.
        self.attention_glimpses = parametrizations.weight_norm(glimpse_vectors, dim=None)
        # Joint representation (BAN Eq. 12) and its projection P_g (Eq. 11), per glimpse.
        joint_rank = self.joint_pool * hidden_dim
        self.joint_x = nn.ModuleList(
            _weight_normed_linear(x_dim, joint_rank) for _ in range(self.glimpses)
        )
        self.joint_y = nn.ModuleList(
            _weight_normed_linear(y_dim, joint_rank) for _ in range(self.glimpses)
        )
        self.joint_projections = nn.ModuleList(
            _weight_normed_linear(hidden_dim, y_dim) for _ in range(self.glimpses)
        )
        self.output_projection = (
            None if self.out_dim == y_dim else _weight_normed_linear(y_dim, self.out_dim)
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
        logits = bilinear_attention_logits(
            self._drop(x),
            self._drop(y),
            self.attention_x.weight,
            self.attention_y.weight,
            self.attention_glimpses.weight,
            x_bias=self.attention_x.bias,
            y_bias=self.attention_y.bias,
            x_mask=x_mask,
            y_mask=y_mask,
            dropout=self.attention_dropout,
            training=self.training,
        )
        return bilinear_attention_map(logits)

    def _joint_x_features(self, x: Tensor) -> Tensor:
        """relu(U'_g^T x + u_g) for every glimpse g at once: (B, T_x, G, rank)."""
        glimpses = self.joint_x[: self.glimpses]
        weight = torch.cat([linear.weight for linear in glimpses])  # (G rank, d_x)
        bias = torch.cat([linear.bias for linear in glimpses])
        return F.relu(F.linear(x, weight, bias)).unflatten(-1, (self.glimpses, -1))

    def fuse(self, inputs: list[Tensor], masks: list[Tensor]) -> Tensor:
        return self.fuse_details(inputs, masks).fused

    def fuse_details(self, inputs: list[Tensor], masks: list[Tensor]) -> FusionOutput:
        """Fused output, sequences [x, the residual stream of y after the last glimpse
        (Eq. 14)] and the G attention maps (B, G, T_x, T_y)."""
        x, y = inputs
        x_mask, y_mask = masks
        attention = self.attention_maps(x, y, x_mask, y_mask)  # (B, G, T_x, T_y), 0 at padding
        # relu(U'_g^T x) of every glimpse in one product when no dropout is drawn (x does
        # not change between glimpses); in training with dropout each glimpse drops x
        # on its own, in the reference's order of random draws.
        all_x = None if self.training and self.dropout > 0 else self._joint_x_features(x)
        stream = y  # the residual stream, (B, T_y, d_y)
        for glimpse in range(self.glimpses):
            if all_x is None:
                x_features = F.relu(self.joint_x[glimpse](self._drop(x)))
            else:
                x_features = all_x[:, :, glimpse]
            y_features = F.relu(self.joint_y[glimpse](self._drop(stream)))
            # f'_g: (B, K), BAN Eq. 12. Padded steps were zeroed on entry and the map is 0
            # at padded pairs, so padded steps add nothing.
            joint = bilinear_pooling_of_features(
                x_features, y_features, attention[:, glimpse], pool=self.joint_pool
            )
            # BAN Eq. 11 (on y, as the reference code): y <- P_g^T f'_g 1^T + y
            stream = stream + self.joint_projections[glimpse](self._drop(joint)).unsqueeze(1)
        # Sum over the real tokens of y (the reference's q_emb.sum(1)), (B, d_y).
        fused = stream.masked_fill(~y_mask.unsqueeze(-1), 0.0).sum(dim=1)
        if self.output_projection is not None:
            fused = self.output_projection(fused)
        return FusionOutput(fused, [x, stream], attention)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, hidden_dim={self.hidden_dim}, glimpses={self.glimpses}, "
            f"attention_rank={self.attention_rank}, joint_pool={self.joint_pool}, "
            f"dropout={self.dropout}, attention_dropout={self.attention_dropout}"
        )
