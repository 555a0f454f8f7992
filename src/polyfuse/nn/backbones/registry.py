"""A registry of backbones: models that encode the modalities themselves and take
any registered fusion module of :mod:`polyfuse.nn` as an extra module.

>>> from polyfuse.nn import backbones
>>> backbones.available()
['lstm_lmf', 'mult']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["available", "create", "get", "register"]

_BACKBONES: dict[str, type[nn.Module]] = {}
BackboneType = TypeVar("BackboneType", bound=type[nn.Module])


def register(name: str) -> Callable[[BackboneType], BackboneType]:
    """Class decorator that adds a backbone to the registry under ``name``."""

    def decorator(cls: BackboneType) -> BackboneType:
        key = name.lower()
        if key in _BACKBONES and _BACKBONES[key] is not cls:
            raise ValueError(f"backbone name {key!r} is already registered")
        _BACKBONES[key] = cls
        cls.registry_name = key
        return cls

    return decorator


def available() -> list[str]:
    """Names of the registered backbones, sorted."""
    return sorted(_BACKBONES)


def get(name: str) -> type[nn.Module]:
    """The backbone class registered as ``name``; an unknown name lists the known ones."""
    key = name.lower() if isinstance(name, str) else name
    if key not in _BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; available: {', '.join(available())} (or 'fusion')")
    return _BACKBONES[key]


def create(name: str, **kwargs: Any) -> nn.Module:
    """Build the backbone registered as ``name``."""
    return get(name)(**kwargs)
