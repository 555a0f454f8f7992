"""Build a backbone of :mod:`polyfuse.nn.backbones` from a configuration.

``model.backbone`` names the backbone (``mult``, ``lstm_lmf``), ``model.options.<backbone>``
its keyword arguments, and ``model.fusion`` the extra module (any registered fusion
module, with ``model.options.<fusion>`` and ``model.fusion_dim``), or ``none`` for
the backbone alone.
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


def build_named_backbone(
    config: Mapping[str, Any],
    input_dims: Sequence[int],
    names: Sequence[str],
    fusion_options: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> nn.Module:
    """The backbone of ``model.backbone`` with the extra module of ``model.fusion``."""
    model = config["model"]
    options = _backbone_options(config)
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
