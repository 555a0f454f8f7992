"""Load weights trained by other code bases into polyfuse modules.

:func:`load_ban_vqa` reads a state dict of ``BanModel`` from the authors' BAN code
(github.com/jnhwkim/ban-vqa) and returns a :class:`polyfuse.nn.BAN` that computes
the model's fusion path: the attention ``v_att``, the glimpse loop over ``b_net``
and ``q_prj`` and the sum of ``q_emb`` over its tokens (the input of the
classifier). The question encoder, the counting module and the classifier are not
part of it: the BAN takes the image features ``v`` and the GRU outputs ``q_emb``.

Key layout of the reference (``<i>`` is 1 when the ``FCNet`` has dropout, 0 if not;
its linear layers use the old ``torch.nn.utils.weight_norm`` with ``dim=None``):

- ``v_att.logits.v_net.main.<i>.{weight_g,weight_v,bias}``: U of BAN Eq. 13, (K', d_x)
- ``v_att.logits.q_net.main.<i>.{...}``: V of BAN Eq. 13, (K', d_y)
- ``v_att.logits.h_mat_g`` (scalar), ``v_att.logits.h_mat_v`` (1, G, 1, K'): the p_g of
  Eq. 10, weight-normalised together; ``v_att.logits.h_bias`` (1, G, 1, 1) is a
  constant per map, which the softmax cancels, and is not needed
- ``b_net.<g>.{v_net,q_net}.main.<i>.{...}``: U'_g, V'_g of Eq. 12, (k K, d_x), (k K, d_y)
- ``q_prj.<g>.main.<i>.{...}``: P_g of Eq. 11, (d_y, K)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import Tensor

from polyfuse.nn.ban import BAN

__all__ = ["load_ban_vqa"]

_OWNER = "load_ban_vqa"


def _linear_weight(
    state: Mapping[str, Tensor], stem: str, what: str
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(g, v, bias)`` of the single linear layer of an ``FCNet`` under ``stem``.

    ``g`` is a scalar and ``v`` the direction, ``weight = g * v / ||v||_F`` (weight
    norm with ``dim=None``). A layer stored with another weight norm (old or
    parametrization keys) or without one is brought to this form.
    """
    pattern = re.compile(re.escape(stem) + r"main\.(\d+)\.")
    indices = sorted({int(m.group(1)) for key in state if (m := pattern.match(key))})
    if not indices:
        raise ValueError(
            f"{_OWNER}: missing keys {stem}main.<i>.weight_g/weight_v/bias ({what}); "
            "is this a state dict of ban-vqa's BanModel?"
        )
    layers = [
        i
        for i in indices
        if any(
            f"{stem}main.{i}.{name}" in state
            for name in ("weight_v", "weight", "parametrizations.weight.original1")
        )
    ]
    if len(layers) != 1:
        raise ValueError(
            f"{_OWNER}: expected one linear layer under {stem}main ({what}), found {len(layers)}"
        )
    base = f"{stem}main.{layers[0]}."
    for g_key, v_key in [
        ("weight_g", "weight_v"),
        ("parametrizations.weight.original0", "parametrizations.weight.original1"),
    ]:
        if base + v_key in state:
            if base + g_key not in state:
                raise ValueError(f"{_OWNER}: missing key {base + g_key} ({what})")
            g, v = state[base + g_key], state[base + v_key]
            break
    else:
        weight = state[base + "weight"]
        g, v = weight.norm(), weight
    if v.dim() != 2:
        raise ValueError(
            f"{_OWNER}: {base} weight has shape {tuple(v.shape)}; expected 2-d ({what})"
        )
    if g.numel() != 1:  # a weight norm over rows (dim=0): store the effective weight
        try:
            weight = v * (g.reshape(-1, 1) / v.norm(dim=1, keepdim=True))
        except RuntimeError:
            raise ValueError(
                f"{_OWNER}: {base}weight_g has shape {tuple(g.shape)}, which does not fit "
                f"weight_v of shape {tuple(v.shape)} ({what})"
            ) from None
        g, v = weight.norm(), weight
    bias = state.get(base + "bias")
    if bias is not None and tuple(bias.shape) != (v.shape[0],):
        raise ValueError(
            f"{_OWNER}: {base}bias has shape {tuple(bias.shape)}, expected ({v.shape[0]},) ({what})"
        )
    return g.reshape(()), v, bias


def _glimpse_vectors(state: Mapping[str, Tensor], stem: str) -> tuple[Tensor, Tensor]:
    """``(g, v)`` of the attention's ``h_mat``, with v reshaped to (G, K')."""
    if stem + "h_mat_v" in state:
        if stem + "h_mat_g" not in state:
            raise ValueError(f"{_OWNER}: missing key {stem}h_mat_g (weight norm of p_g)")
        g, v = state[stem + "h_mat_g"], state[stem + "h_mat_v"]
        if g.numel() != 1:
            raise ValueError(
                f"{_OWNER}: {stem}h_mat_g has shape {tuple(g.shape)}; the reference "
                "normalises h_mat as a whole (dim=None), a scalar"
            )
    elif stem + "h_mat" in state:
        v = state[stem + "h_mat"]
        g = v.norm()
    else:
        raise ValueError(
            f"{_OWNER}: missing keys {stem}h_mat_g/h_mat_v (the glimpse vectors p_g of the "
            "attention, BAN Eq. 10)"
        )
    if v.dim() != 4 or v.shape[0] != 1 or v.shape[2] != 1:
        raise ValueError(
            f"{_OWNER}: {stem}h_mat_v has shape {tuple(v.shape)}; expected (1, G, 1, K')"
        )
    return g.reshape(()), v[0, :, 0, :]


def _check_size(actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"{_OWNER}: inconsistent shapes: {what} is {actual}, expected {expected}")


def load_ban_vqa(
    state_dict: Mapping[str, Tensor],
    *,
    glimpses: int | None = None,
    prefix: str | None = None,
    dropout: float = 0.2,
    attention_dropout: float = 0.5,
) -> BAN:
    """Build a :class:`polyfuse.nn.BAN` from a state dict of ban-vqa's ``BanModel``.

    All sizes are read from the tensors: d_x (``v_dim``), d_y (the question
    embedding size), the attention rank K', the joint rank K, the sum pooling of
    ``b_net`` and the number of glimpses G. The result has ``out_dim = d_y`` and
    therefore no output projection, so in eval mode
    ``ban([v, q_emb], masks=[v_mask, None])`` equals the reference's
    ``q_emb.sum(1)`` after its glimpse loop (without the counting module), where
    ``v_mask`` marks the rows of v that are not all zero (the reference masks
    those). Weights are copied as (g, v) pairs, so the computation is the same.

    Args:
        state_dict: the reference model's ``state_dict()``, or a checkpoint dict
            holding it under ``"model_state"``. Keys other than ``v_att.``,
            ``b_net.<g>.`` and ``q_prj.<g>.`` (w_emb, q_emb, c_prj, counter,
            classifier) are ignored.
        glimpses: None to use all G glimpses; n <= G to keep the first n (a prefix
            of the residual chain is itself a valid BAN).
        prefix: prefix of the keys (``"module."`` for a model saved from
            ``nn.DataParallel``); None detects ``""`` or ``"module."``.
        dropout: dropout before each linear map of the returned module.
        attention_dropout: dropout inside the attention logits.

    Returns:
        A BAN with ``input_dims = [d_x, d_y]`` and ``out_dim = d_y``, in training
        mode like any new module (call ``.eval()`` to turn dropout off), with the
        dtype of the stored weights.

    Raises:
        ValueError: required keys are missing or the shapes are inconsistent.
    """
    if "model_state" in state_dict and isinstance(state_dict["model_state"], Mapping):
        state_dict = state_dict["model_state"]
    if prefix is None:
        candidates = [
            p for p in ("", "module.") if any(k.startswith(p + "v_att.") for k in state_dict)
        ]
        if not candidates:
            raise ValueError(
                f"{_OWNER}: no key starts with 'v_att.' or 'module.v_att.'; "
                "is this a state dict of ban-vqa's BanModel?"
            )
        prefix = candidates[0]
    state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}

    att_g_x, att_v_x, att_bias_x = _linear_weight(state, "v_att.logits.v_net.", "attention U")
    att_g_y, att_v_y, att_bias_y = _linear_weight(state, "v_att.logits.q_net.", "attention V")
    glimpse_g, glimpse_v = _glimpse_vectors(state, "v_att.logits.")
    attention_rank, x_dim = att_v_x.shape
    y_dim = att_v_y.shape[1]
    _check_size(att_v_y.shape[0], attention_rank, "the rank of v_att.logits.q_net")
    _check_size(glimpse_v.shape[1], attention_rank, "the last size of v_att.logits.h_mat_v")
    stored_glimpses = glimpse_v.shape[0]
    if glimpses is None:
        glimpses = stored_glimpses
    if not 1 <= glimpses <= stored_glimpses:
        raise ValueError(
            f"{_OWNER}: glimpses={glimpses}, but the state dict holds {stored_glimpses} glimpses"
        )
    if glimpses < stored_glimpses:  # keep the first rows; rescale g so they are unchanged
        full_norm = glimpse_v.norm()
        glimpse_v = glimpse_v[:glimpses]
        glimpse_g = glimpse_g * glimpse_v.norm() / full_norm

    joint_layers = []
    hidden_dim = joint_rank = None
    for glimpse in range(glimpses):
        joint_x = _linear_weight(state, f"b_net.{glimpse}.v_net.", f"U' of glimpse {glimpse}")
        joint_y = _linear_weight(state, f"b_net.{glimpse}.q_net.", f"V' of glimpse {glimpse}")
        projection = _linear_weight(state, f"q_prj.{glimpse}.", f"P of glimpse {glimpse}")
        if joint_rank is None:
            joint_rank, hidden_dim = joint_x[1].shape[0], projection[1].shape[1]
        _check_size(joint_x[1].shape[1], x_dim, f"the input size of b_net.{glimpse}.v_net")
        _check_size(joint_y[1].shape[1], y_dim, f"the input size of b_net.{glimpse}.q_net")
        _check_size(joint_x[1].shape[0], joint_rank, f"the rank of b_net.{glimpse}.v_net")
        _check_size(joint_y[1].shape[0], joint_rank, f"the rank of b_net.{glimpse}.q_net")
        _check_size(projection[1].shape[0], y_dim, f"the output size of q_prj.{glimpse}")
        _check_size(projection[1].shape[1], hidden_dim, f"the input size of q_prj.{glimpse}")
        joint_layers.append((joint_x, joint_y, projection))
    if joint_rank % hidden_dim:
        raise ValueError(
            f"{_OWNER}: inconsistent shapes: the rank {joint_rank} of b_net is not a multiple "
            f"of the input size {hidden_dim} of q_prj"
        )

    ban = BAN(
        [x_dim, y_dim],
        y_dim,
        hidden_dim=hidden_dim,
        glimpses=glimpses,
        attention_rank=attention_rank,
        joint_pool=joint_rank // hidden_dim,
        dropout=dropout,
        attention_dropout=attention_dropout,
    )
    if att_v_x.is_floating_point():
        ban = ban.to(dtype=att_v_x.dtype)

    weights: dict[str, Tensor] = {}

    def put(name: str, layer: tuple[Tensor, Tensor, Tensor | None]) -> None:
        g, v, bias = layer
        weights[f"{name}.parametrizations.weight.original0"] = g
        weights[f"{name}.parametrizations.weight.original1"] = v
        if bias is not None:
            weights[f"{name}.bias"] = bias

    put("attention_x", (att_g_x, att_v_x, att_bias_x))
    put("attention_y", (att_g_y, att_v_y, att_bias_y))
    put("attention_glimpses", (glimpse_g, glimpse_v, None))
    for glimpse, (joint_x, joint_y, projection) in enumerate(joint_layers):
        put(f"joint_x.{glimpse}", joint_x)
        put(f"joint_y.{glimpse}", joint_y)
        put(f"joint_projections.{glimpse}", projection)
    for key, value in ban.state_dict().items():
        if key.endswith(".bias") and key not in weights:  # a layer stored without a bias
            weights[key] = torch.zeros_like(value)
    ban.load_state_dict(weights, strict=True)
    return ban
