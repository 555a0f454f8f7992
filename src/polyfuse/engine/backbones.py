"""Build a backbone of :mod:`polyfuse.nn.backbones` from a configuration.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

import polyfuse.nn
from polyfuse.nn import backbones

__all__ = ["build_named_backbone"]

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
