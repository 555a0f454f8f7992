"""Models from the ``model`` section of a configuration, for every task type.

:func:`build_backbone` builds the model a task's head sits on: encoders, the fusion module
of ``model.fusion`` and the projection (:class:`~polyfuse.nn.backbones.fusion.FusionBackbone`), or
a backbone of :mod:`polyfuse.nn.backbones` named by ``model.backbone``.
:func:`fusion_options` checks ``model.options.<fusion>`` against the module's signature.

``model.backbone`` names the backbone (``mult``, ``lstm_lmf``), ``model.options.<backbone>``
its keyword arguments, and ``model.fusion`` the extra module (any registered fusion
module, with ``model.options.<fusion>`` and ``model.fusion_dim``), or ``none`` for
the backbone alone.

``lstm_lmf`` reads one modality with its LSTM (LMF's text subnetwork) and the others
with the pooled audio / video subnetwork: ``model.options.lstm_lmf.text`` names that
modality (a name of ``data.modalities`` or an index); by default the modality named
``text``. Without a modality named ``text`` and without the option the build is
refused: the LSTM would otherwise read whichever modality comes first (audio, when a
data set has no text).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import polyfuse.nn
from polyfuse.nn import backbones
from polyfuse.nn.backbones.fusion import FusionBackbone, ModalityEncoder

__all__ = ["build_backbone", "build_named_backbone", "fusion_options", "text_encoder"]

_RESERVED = ("self", "input_dims", "extra", "modality_names")


def _backbone_options(config: Mapping[str, Any]) -> dict[str, Any]:
    name = config["model"]["backbone"]
    cls = backbones.get(name)  # an unknown name lists the known ones
    options = dict(config["model"]["options"].get(name) or {})
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(key for key in options if key not in accepted or key in _RESERVED)
    if unknown:
        valid = [key for key in accepted if key not in _RESERVED]
        raise ValueError(f"model.options.{name}: unknown option(s) {unknown}; {cls.__name__} takes: {', '.join(valid)}")
    return options


def _lstm_modality(options: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``lstm_lmf``'s ``text`` option as an index: a modality name, an index, or by default
    the modality named ``text`` (refused when there is none)."""
    text = options.get("text")
    if isinstance(text, int) and not isinstance(text, bool):
        return options
    if text is None:
        if "text" not in names:
            raise ValueError(
                f"model.backbone lstm_lmf reads one modality with its LSTM (LMF's text subnetwork) and none of "
                f"the modalities {list(names)} is named 'text': set model.options.lstm_lmf.text to the one the "
                "LSTM should read (a name or an index), the others get the pooled audio / video subnetwork"
            )
        text = "text"
    if text not in names:
        raise ValueError(f"model.options.lstm_lmf.text names {text!r}, not one of the modalities {list(names)}")
    return {**options, "text": list(names).index(text)}


def build_named_backbone(
    config: Mapping[str, Any],
    input_dims: Sequence[int],
    names: Sequence[str],
    fusion_options: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> nn.Module:
    """The backbone of ``model.backbone`` with the extra module of ``model.fusion``."""
    model = config["model"]
    options = _backbone_options(config)
    if model["backbone"] == "lstm_lmf":
        options = _lstm_modality(options, names)
    fusion = model["fusion"]
    extra = None
    if fusion != "none":
        cls = polyfuse.nn.get(fusion)
        extra_options = fusion_options(config)
        limit = getattr(cls, "max_modalities", None)
        if limit is not None and len(input_dims) > limit:
            raise ValueError(
                f"{cls.__name__} takes at most {limit} inputs, but backbone {model['backbone']!r} gives its "
                f"extra module one per modality ({len(input_dims)}: {list(names)})"
            )

        def extra(dims: list[int]) -> nn.Module:
            try:
                return polyfuse.nn.create(fusion, input_dims=dims, out_dim=int(model["fusion_dim"]), **extra_options)
            except TypeError as error:
                raise ValueError(f"model.options.{fusion}: {error}") from None

    return backbones.create(model["backbone"], input_dims=list(input_dims), extra=extra,
                            modality_names=list(names), **options)


def _groups(config: Mapping[str, Any], names: Sequence[str]) -> list[list[int]] | None:
    fusion = config["model"]["fusion"]
    spec = config["model"]["input_groups"].get(fusion)
    if not spec:
        return None
    groups = []
    for group in spec:
        group = [group] if isinstance(group, str) else list(group)
        for name in group:
            if name not in names:
                raise ValueError(
                    f"model.input_groups.{fusion} names {name!r}, not one of the modalities {list(names)}"
                )
        groups.append([list(names).index(name) for name in group])
    return groups


def _input_indices(
    values: Sequence[str | int], names: Sequence[str], groups: list[list[int]] | None, option: str
) -> list[int]:
    """Fusion input indices for modality names (indices pass through), e.g. TFN's and
    LMF's ``sequence_modalities: [text]``; with input groups, the group holding the name."""
    inputs = groups or [[j] for j in range(len(names))]
    indices = []
    for value in values:
        if isinstance(value, int):
            indices.append(value)
            continue
        if value not in names:
            raise ValueError(f"{option} names {value!r}, not one of the modalities {list(names)}")
        indices.append(next(i for i, group in enumerate(inputs) if list(names).index(value) in group))
    return indices


def fusion_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword options of ``model.fusion``'s class from ``model.options.<name>`` of a
    resolved configuration, checked against its signature (an unknown option is an error
    listing those it takes), with ``seed`` added for a fusion that takes one."""
    name = config["model"]["fusion"]
    cls = polyfuse.nn.get(name)  # an unknown name lists the known ones
    options = dict(config["model"]["options"].get(name) or {})
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(key for key in options if key not in accepted or key in ("self", "input_dims", "out_dim"))
    if unknown and not takes_any:
        valid = [key for key in accepted if key not in ("self", "input_dims", "out_dim")]
        raise ValueError(f"model.options.{name}: unknown option(s) {unknown}; {cls.__name__} takes: {', '.join(valid)}")
    if "seed" in accepted and "seed" not in options:
        options["seed"] = int(config["seed"])  # e.g. MAN's random features
    return options


def _with_config_keys(message: str, fusion: str, cls: type) -> str:
    """``message`` with the config keys of the constructor arguments it names, for CLI users
    (TFN's size guard names ``max_fused_size``; a config sets ``model.options.tfn.max_fused_size``)."""
    named = [
        name for name in inspect.signature(cls.__init__).parameters
        if name not in ("self", "input_dims", "out_dim") and re.search(rf"\b{re.escape(name)}\b", message)
    ]
    if not named:
        return message
    keys = ", ".join(f"model.options.{fusion}.{name}" for name in named)
    return f"{message} [in a configuration: {keys}]"


def build_backbone(config: Mapping[str, Any], input_dims: Sequence[int], names: Sequence[str]) -> torch.nn.Module:
    """Encoders, the fusion module named by ``model.fusion`` and the projection; or,
    with ``model.backbone`` other than ``fusion``, that backbone with the fusion
    module as its extra module (:func:`build_named_backbone`)."""
    model = config["model"]
    if model.get("backbone", "fusion") != "fusion":
        return build_named_backbone(config, input_dims, names, fusion_options)
    encoder = model["encoder"]
    marker = bool(model["centre_marker"])  # one more input channel per modality
    encoders = [
        ModalityEncoder(d + marker, kind=encoder.get("type", "linear"), hidden_dim=int(encoder.get("hidden_dim", 64)),
                        dropout=float(encoder.get("dropout", 0.0)))
        for d in input_dims
    ]
    groups = _groups(config, names)
    group_dims = [sum(encoders[j].output_dim for j in g) for g in groups] if groups else [e.output_dim for e in encoders]
    options = fusion_options(config)
    if options.get("sequence_modalities") is not None:  # TFN, LMF: names of the LSTM-read modalities
        options["sequence_modalities"] = _input_indices(
            options["sequence_modalities"], names, groups, f"model.options.{model['fusion']}.sequence_modalities"
        )
    cls = polyfuse.nn.get(model["fusion"])
    limit = getattr(cls, "max_modalities", None)
    if limit is not None and len(group_dims) > limit:
        raise ValueError(
            f"{cls.__name__} takes at most {limit} inputs but the data has {len(group_dims)} modalities "
            f"{list(names)}; set model.input_groups.{model['fusion']} (e.g. [[{names[0]}], "
            f"[{', '.join(names[1:])}]]) to group them"
        )
    try:
        fusion = polyfuse.nn.create(model["fusion"], input_dims=group_dims, out_dim=int(model["fusion_dim"]), **options)
    except TypeError as error:
        raise ValueError(f"model.options.{model['fusion']}: {error}") from None
    except ValueError as error:
        raise ValueError(_with_config_keys(str(error), model["fusion"], cls)) from None
    return FusionBackbone(
        fusion, encoders, fusion_dim=int(model["fusion_dim"]), out_dim=int(model["out_dim"]), groups=groups,
        skip=bool(model["skip"]), centre_marker=marker, dropout=float(model["dropout"]), modality_names=names,
    )


def text_encoder(kind: str, vocabulary: Sequence[str] | None = None, *, word_vectors: str | None = None,
                 trainable: bool = False):
    """``"minilm"``; ``"bow"`` (word counts over ``vocabulary``, for synthetic corpora);
    ``"glove"`` (the GloVe-format ``word_vectors`` file). ``trainable``: built to be fine-tuned."""
    from polyfuse.nn.sentence_encoder import MiniLMEncoder, StaticWordEncoder

    if kind == "bow":
        from polyfuse.data.synthetic_retrieval import BagOfWordsEncoder

        if not vocabulary:
            raise ValueError("text: bow needs the corpus's vocabulary")
        return BagOfWordsEncoder(list(vocabulary))
    if kind == "glove":
        if not word_vectors:
            raise ValueError("text: glove needs word_vectors (a GloVe-format vectors file)")
        return StaticWordEncoder.from_file(word_vectors, trainable=trainable)
    if kind == "minilm":
        return MiniLMEncoder(trainable=trainable)
    raise ValueError(f"unknown text encoder {kind!r}; expected minilm, glove or bow")
