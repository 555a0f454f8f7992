"""Load weights trained by other code bases into polyfuse modules.

:func:`load_ban_vqa` reads a whole state dict of ``BanModel`` from the authors' BAN
code (github.com/jnhwkim/ban-vqa) into a :class:`polyfuse.nn.models.vqa.BanVQA`: word
embedding (one, or two concatenated as ban-vqa's default ``--op c``), question GRU,
attention, bilinear residual blocks, projections, counter, count projections and
classifier. Every key the model needs must be in the file (a missing one is an error
that names it) and every key of the file must be used (a key left over is an error
that lists it). :func:`load_ban_fusion` takes the fusion path only
(attention ``v_att``, glimpse loop over ``b_net`` and ``q_prj``) as a
:class:`polyfuse.nn.BAN`, for a state dict that holds nothing else or with
``ignore`` naming the parts to leave out.

Key layout of the reference (``<i>`` is 1 when the ``FCNet`` has dropout, 0 if not;
its linear layers use the old ``torch.nn.utils.weight_norm`` with ``dim=None``):

- ``w_emb.emb.weight`` (V + 1, 300): word embedding, the last row padding
- ``w_emb.emb_.weight`` (V + 1, 300), only with ``--op c`` (ban-vqa's default): a second
  embedding (tf-idf-weighted GloVe at the start, trained), concatenated after the first,
  so the GRU has 600 inputs
- ``q_emb.rnn.{weight_ih_l0,weight_hh_l0,bias_ih_l0,bias_hh_l0}``: the question GRU
  (``weight_ih_l0`` (3H, 300) or, with ``--op c``, (3H, 600))
- ``v_att.logits.v_net.main.<i>.{weight_g,weight_v,bias}``: U of BAN Eq. 13, (K', d_v)
- ``v_att.logits.q_net.main.<i>.{...}``: V of BAN Eq. 13, (K', H)
- ``v_att.logits.h_mat_g`` (scalar), ``v_att.logits.h_mat_v`` (1, G, 1, K'): the p_g of
  Eq. 10, weight-normalised together; ``v_att.logits.h_bias`` (1, G, 1, 1) a constant
  per map, which the softmax cancels but the counter (reading the logits) does not
- ``b_net.<g>.{v_net,q_net}.main.<i>.{...}``: U'_g, V'_g of Eq. 12, (k K, d_v), (k K, H)
- ``q_prj.<g>.main.<i>.{...}``: P_g of Eq. 11, (H, K)
- ``c_prj.<g>.main.0.{...}``: projection of the count features, (H, objects + 1)
- ``counter.f.<k>.weight`` (n + 1,): the piecewise linear f_{k+1} of the counter; the
  reference builds 16 and uses f.0 to f.7, so f.8 to f.15 are never trained and must
  hold their initial value [0, 1, ..., 1] (anything else is an error)
- ``classifier.main.{0,3}.{weight_g,weight_v,bias}``: the two-layer classifier
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from polyfuse.nn.ban import BAN
from polyfuse.nn.models.vqa import BanVQA

__all__ = ["load_ban_fusion", "load_ban_vqa"]

_OWNER = "load_ban_vqa"


class _TrackedState(dict):
    """A state dict that records which keys were read (``[]`` or ``get``)."""

    def __init__(self, items: Mapping[str, Tensor]) -> None:
        super().__init__(items)
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> Tensor:
        value = super().__getitem__(key)
        self.used.add(key)
        return value

    def get(self, key, default=None):
        if key in self:
            return self[key]
        return default

    def unused(self) -> list[str]:
        return sorted(set(self) - self.used)


def _tensor(state: Mapping[str, Tensor], key: str, what: str, shape: tuple[int, ...] | None = None) -> Tensor:
    if key not in state:
        raise ValueError(f"{_OWNER}: missing key {key} ({what})")
    value = state[key]
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{_OWNER}: {key} has shape {tuple(value.shape)}, expected {shape} ({what})")
    return value


def _linear_weight(state: Mapping[str, Tensor], stem: str, what: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(g, v, bias)`` of the single linear layer of an ``FCNet`` under ``stem``.

    ``g`` is a scalar and ``v`` the direction, ``weight = g * v / ||v||_F`` (weight
    norm with ``dim=None``). A layer stored with another weight norm (old or
    parametrization keys) or without one is brought to this form. Every ``FCNet`` of
    the reference has a bias: a missing one is an error, as is a missing half of a
    weight norm.
    """
    pattern = re.compile(re.escape(stem) + r"main\.(\d+)\.")
    indices = sorted({int(m.group(1)) for key in state if (m := pattern.match(key))})
    if not indices:
        raise ValueError(
            f"{_OWNER}: missing keys {stem}main.<i>.weight_g/weight_v/bias ({what}); "
            "is this a state dict of ban-vqa's BanModel?"
        )
    if len(indices) != 1:
        raise ValueError(
            f"{_OWNER}: expected one linear layer under {stem}main ({what}), found keys of "
            f"{len(indices)}: main.{indices}"
        )
    base = f"{stem}main.{indices[0]}."
    for g_key, v_key in [
        ("weight_g", "weight_v"),
        ("parametrizations.weight.original0", "parametrizations.weight.original1"),
    ]:
        if base + g_key in state or base + v_key in state:
            g = _tensor(state, base + g_key, what)
            v = _tensor(state, base + v_key, what)
            break
    else:
        if base + "weight" not in state:
            raise ValueError(f"{_OWNER}: missing keys {base}weight_g and {base}weight_v ({what})")
        weight = state[base + "weight"]
        g, v = weight.norm(), weight
    if v.dim() != 2:
        raise ValueError(
            f"{_OWNER}: {base}weight_v has shape {tuple(v.shape)}; expected 2-d ({what})"
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
    bias = _tensor(state, base + "bias", what, (v.shape[0],))
    return g.reshape(()), v, bias


def _glimpse_vectors(state: Mapping[str, Tensor], stem: str) -> tuple[Tensor, Tensor]:
    """``(g, v)`` of the attention's ``h_mat``, with v reshaped to (G, K')."""
    if stem + "h_mat_v" in state or stem + "h_mat_g" in state:
        what = "the weight-normed glimpse vectors p_g of the attention, BAN Eq. 10"
        g, v = _tensor(state, stem + "h_mat_g", what), _tensor(state, stem + "h_mat_v", what)
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
            f"{_OWNER}: missing keys {stem}h_mat_g and {stem}h_mat_v (the glimpse vectors p_g "
            "of the attention, BAN Eq. 10)"
        )
    if v.dim() != 4 or v.shape[0] != 1 or v.shape[2] != 1:
        raise ValueError(
            f"{_OWNER}: {stem}h_mat_v has shape {tuple(v.shape)}; expected (1, G, 1, K')"
        )
    return g.reshape(()), v[0, :, 0, :]


def _check_size(actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"{_OWNER}: inconsistent shapes: {what} is {actual}, expected {expected}")


def _strip_prefix(state_dict: Mapping[str, Tensor], prefix: str | None) -> _TrackedState:
    """The state under ``prefix`` (None: detect ``""`` or ``"module."``), tracked."""
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
    outside = sorted(k for k in state_dict if not k.startswith(prefix))
    if outside:
        raise ValueError(f"{_OWNER}: keys without the prefix {prefix!r}: {outside[:20]}")
    return _TrackedState({k[len(prefix) :]: v for k, v in state_dict.items()})


def load_ban_fusion(
    state_dict: Mapping[str, Tensor],
    *,
    glimpses: int | None = None,
    prefix: str | None = None,
    dropout: float = 0.2,
    attention_dropout: float = 0.5,
    ignore: Iterable[str] = ("w_emb.", "q_emb.", "c_prj.", "counter.", "classifier."),
) -> BAN:
    """Build a :class:`polyfuse.nn.BAN` from the fusion path of ban-vqa's ``BanModel``.

    All sizes are read from the tensors: d_x (``v_dim``), d_y (the question
    embedding size), the attention rank K', the joint rank K, the sum pooling of
    ``b_net`` and the number of glimpses G. The result has ``out_dim = d_y`` and
    therefore no output projection, so in eval mode
    ``ban([v, q_emb], masks=[v_mask, None])`` equals the reference's
    ``q_emb.sum(1)`` after its glimpse loop without the counting module, where
    ``v_mask`` marks the rows of v that are not all zero (the reference masks
    those). For the whole model, counter included, use :func:`load_ban_vqa`.

    Args:
        state_dict: the reference model's ``state_dict()``, or a checkpoint dict
            holding it under ``"model_state"``.
        glimpses: None to use all G glimpses; n <= G to keep the first n (a prefix
            of the residual chain is itself a valid BAN); the keys of the other
            glimpses are then left out.
        prefix: prefix of the keys (``"module."`` for a model saved from
            ``nn.DataParallel``); None detects ``""`` or ``"module."``.
        dropout: dropout before each linear map of the returned module.
        attention_dropout: dropout inside the attention logits.
        ignore: key prefixes (after ``prefix``) that are not part of the fusion and
            are left out on purpose: by default the embedding, question GRU, count
            projections, counter and classifier. Any other key that is not used is
            an error listing it.

    Returns:
        A BAN with ``input_dims = [d_x, d_y]`` and ``out_dim = d_y``, in training
        mode like any new module (call ``.eval()`` to turn dropout off), with the
        dtype of the stored weights.

    Raises:
        ValueError: required keys are missing, the shapes are inconsistent, or
            keys are left over.
    """
    state = _strip_prefix(state_dict, prefix)
    ban, stored_glimpses = _ban_from_state(state, glimpses, dropout, attention_dropout)
    ignored = tuple(ignore)
    if ban.glimpses < stored_glimpses:
        ignored += tuple(f"{part}.{g}." for g in range(ban.glimpses, stored_glimpses) for part in ("b_net", "q_prj"))
    state.used.add("v_att.logits.h_bias")  # cancels in the softmax, and the BAN has no counter
    left_over = [k for k in state.unused() if not k.startswith(ignored)]
    if left_over:
        raise ValueError(f"{_OWNER}: keys that are not part of BAN's fusion path: {left_over}")
    return ban


def _ban_from_state(
    state: _TrackedState, glimpses: int | None, dropout: float, attention_dropout: float
) -> tuple[BAN, int]:
    """The BAN of the fusion path and the number of glimpses stored."""
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
        """(g, v, bias) -> a weight-normed linear layer of the BAN; bias None for the
        glimpse vectors p_g, which have none."""
        g, v, bias = layer
        weights[f"{name}.parametrizations.weight.original0"] = g
        weights[f"{name}.parametrizations.weight.original1"] = v
        if bias is not None:
            weights[f"{name}.bias"] = bias

    def put_stacked(name: str, layers: list[tuple[Tensor, Tensor, Tensor]]) -> None:
        """One (g, v, bias) per glimpse -> the stacked parameters of a GlimpseLinears."""
        weights[f"{name}.weight_g"] = torch.stack([g.reshape(1, 1) for g, _, _ in layers])
        weights[f"{name}.weight_v"] = torch.stack([v for _, v, _ in layers])
        weights[f"{name}.bias"] = torch.stack([bias for _, _, bias in layers])

    put("attention_x", (att_g_x, att_v_x, att_bias_x))
    put("attention_y", (att_g_y, att_v_y, att_bias_y))
    put("attention_glimpses", (glimpse_g, glimpse_v, None))  # h_bias is apart (h_mat has none)
    for index, name in enumerate(("joint_x", "joint_y", "joint_projections")):
        put_stacked(name, [layers[index] for layers in joint_layers])
    ban.load_state_dict(weights, strict=True)
    return ban, stored_glimpses


def _classifier_layer(state: _TrackedState, index: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(g, v, bias)`` of ``classifier.main.<index>`` (a weight-normed linear layer)."""
    base = f"classifier.main.{index}."
    what = "the answer classifier"
    if base + "weight_v" in state or base + "weight_g" in state:
        g, v = _tensor(state, base + "weight_g", what), _tensor(state, base + "weight_v", what)
        if g.numel() != 1:
            raise ValueError(f"{_OWNER}: {base}weight_g has shape {tuple(g.shape)}; expected a scalar (dim=None)")
    elif base + "weight" in state:
        v = state[base + "weight"]
        g = v.norm()
    else:
        raise ValueError(f"{_OWNER}: missing keys {base}weight_g and {base}weight_v ({what})")
    return g.reshape(()), v, _tensor(state, base + "bias", what, (v.shape[0],))


def load_ban_vqa(
    state_dict: Mapping[str, Tensor],
    *,
    prefix: str | None = None,
    dropout: float = 0.2,
    attention_dropout: float = 0.5,
    classifier_dropout: float = 0.5,
) -> BanVQA:
    """Build a :class:`polyfuse.nn.models.vqa.BanVQA` from a whole state dict of ban-vqa's ``BanModel``.

    Sizes come from the tensors: vocabulary V and embedding size, GRU hidden size H,
    image feature size, attention rank, glimpses G, the counter's objects and pieces,
    and the number of answers. In eval mode ``model(q, v, b[:, :, :4])`` returns the
    reference's ``(logits, att)`` for its inputs ``(v, b, q)``. A state dict with
    ``w_emb.emb_.weight`` (ban-vqa's default ``--op c``, the released BAN-Glove-Counter)
    gives a question encoder with a second embedding concatenated after the first; one
    without ``counter.`` and ``c_prj.`` keys gives BAN without counter.

    Every key the model needs must be present: a missing one (a bias, a half of a weight
    norm, a counter function f.0 to f.7, ...) is an error that names it. The counter
    functions f.8 to f.15, which the reference builds but never uses, may be absent.

    Raises:
        ValueError: a missing key (named), inconsistent shapes, or keys left over after
            all parts are loaded (listed), including counter functions f.8 to f.15 that
            are not at their initial value.
    """
    state = _strip_prefix(state_dict, prefix)
    ban, glimpses = _ban_from_state(state, None, dropout, attention_dropout)
    image_dim, hidden_dim = ban.input_dims
    embedding = _tensor(state, "w_emb.emb.weight", "word embedding")
    if embedding.dim() != 2 or embedding.shape[0] < 2:
        raise ValueError(f"{_OWNER}: w_emb.emb.weight has shape {tuple(embedding.shape)}; expected (V + 1, E)")
    num_words, embedding_dim = embedding.shape[0] - 1, embedding.shape[1]
    second_embedding = None  # ban-vqa's --op c: a second embedding concatenated after the first
    second_embedding_dim = 0
    if "w_emb.emb_.weight" in state:
        second_embedding = state["w_emb.emb_.weight"]
        if second_embedding.dim() != 2 or second_embedding.shape[0] != num_words + 1:
            raise ValueError(
                f"{_OWNER}: w_emb.emb_.weight has shape {tuple(second_embedding.shape)}; "
                f"expected ({num_words + 1}, E2), the rows of w_emb.emb.weight"
            )
        second_embedding_dim = second_embedding.shape[1]
    gru_inputs = embedding_dim + second_embedding_dim
    input_weight = _tensor(state, "q_emb.rnn.weight_ih_l0", "question GRU")
    if second_embedding is None and input_weight.dim() == 2 and input_weight.shape[1] > embedding_dim:
        raise ValueError(
            f"{_OWNER}: q_emb.rnn.weight_ih_l0 has shape {tuple(input_weight.shape)}, so the GRU reads "
            f"{input_weight.shape[1]} features per word, but w_emb.emb.weight gives {embedding_dim}: "
            "missing key w_emb.emb_.weight (the second embedding of ban-vqa's --op c)"
        )
    gru = {
        name: _tensor(state, f"q_emb.rnn.{name}", "question GRU", shape)
        for name, shape in [
            ("weight_ih_l0", (3 * hidden_dim, gru_inputs)),
            ("weight_hh_l0", (3 * hidden_dim, hidden_dim)),
            ("bias_ih_l0", (3 * hidden_dim,)),
            ("bias_hh_l0", (3 * hidden_dim,)),
        ]
    }
    attention_bias = _tensor(state, "v_att.logits.h_bias", "attention constant h_bias", (1, glimpses, 1, 1))
    first = _classifier_layer(state, 0)
    last = _classifier_layer(state, 3)
    if first[1].shape[1] != hidden_dim or last[1].shape[1] != first[1].shape[0]:
        raise ValueError(
            f"{_OWNER}: inconsistent shapes: classifier.main.0 is {tuple(first[1].shape)} and "
            f"classifier.main.3 is {tuple(last[1].shape)} for hidden size {hidden_dim}"
        )
    has_counter = any(k.startswith(("counter.", "c_prj.")) for k in state)
    objects = pieces = None
    if has_counter:
        function = _tensor(state, "counter.f.0.weight", "counter")
        pieces = function.numel() - 1
        count_layers = [_linear_weight(state, f"c_prj.{g}.", f"count projection of glimpse {g}") for g in range(glimpses)]
        objects = count_layers[0][1].shape[1] - 1
        for g, layer in enumerate(count_layers):
            _check_size(layer[1].shape[0], hidden_dim, f"the output size of c_prj.{g}")
            _check_size(layer[1].shape[1], objects + 1, f"the input size of c_prj.{g}")
        functions = [_tensor(state, f"counter.f.{k}.weight", "counter", (pieces + 1,)) for k in range(8)]
        initial = torch.ones(pieces + 1, dtype=function.dtype)
        initial[0] = 0
        for k in range(8, 16):  # built by the reference, never used by its forward
            key = f"counter.f.{k}.weight"
            if key in state and not torch.equal(state[key], initial):
                raise ValueError(
                    f"{_OWNER}: {key} differs from its initial value, but the reference counter "
                    "never uses f.8 to f.15; is this another counting module?"
                )

    model = BanVQA(
        num_words,
        last[1].shape[0],
        image_dim,
        hidden_dim=hidden_dim,
        glimpses=glimpses,
        counter_objects=objects,
        embedding_dim=embedding_dim,
        second_embedding_dim=second_embedding_dim or None,
        dropout=dropout,
        attention_dropout=attention_dropout,
        classifier_dropout=classifier_dropout,
    )
    if first[1].shape[0] != 2 * hidden_dim:  # a classifier of another width
        model.classifier[0] = torch.nn.utils.parametrizations.weight_norm(
            torch.nn.Linear(hidden_dim, first[1].shape[0]), dim=None
        )
        model.classifier[3] = torch.nn.utils.parametrizations.weight_norm(
            torch.nn.Linear(first[1].shape[0], last[1].shape[0]), dim=None
        )
    model.ban = ban
    model = model.to(dtype=embedding.dtype)
    weights = {f"ban.{k}": v for k, v in ban.state_dict().items()}
    weights["question.embedding.weight"] = embedding
    if second_embedding is not None:
        weights["question.second_embedding.weight"] = second_embedding
    weights.update({f"question.gru.{k}": v for k, v in gru.items()})
    weights["attention_bias"] = attention_bias.reshape(glimpses)
    for index, (g, v, bias) in [(0, first), (3, last)]:
        weights[f"classifier.{index}.parametrizations.weight.original0"] = g
        weights[f"classifier.{index}.parametrizations.weight.original1"] = v
        weights[f"classifier.{index}.bias"] = bias
    if has_counter:
        weights["counter.weight"] = torch.stack(functions)
        for g, (scale, direction, bias) in enumerate(count_layers):
            weights[f"count_projections.{g}.parametrizations.weight.original0"] = scale
            weights[f"count_projections.{g}.parametrizations.weight.original1"] = direction
            weights[f"count_projections.{g}.bias"] = bias
    left_over = state.unused()
    if left_over:
        raise ValueError(f"{_OWNER}: keys that no part of BanVQA uses: {left_over}")
    model.load_state_dict(weights, strict=True)
    return model
