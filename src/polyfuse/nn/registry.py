"""A registry of fusion modules: every module behind the common interface has a name.

>>> import polyfuse
>>> "man" in polyfuse.nn.available()
True
>>> fusion = polyfuse.nn.create("concat", input_dims=[8, 4], out_dim=16)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["available", "create", "get", "register"]

_REGISTRY: dict[str, type[nn.Module]] = {}
ModuleType = TypeVar("ModuleType", bound=type[nn.Module])


def register(name: str) -> Callable[[ModuleType], ModuleType]:
    """Class decorator that adds a fusion module to the registry under ``name``."""

    def decorator(cls: ModuleType) -> ModuleType:
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"fusion module name {key!r} is already registered")
        _REGISTRY[key] = cls
        cls.registry_name = key
        return cls

    return decorator


def available() -> list[str]:
    """Names of all registered fusion modules, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> type[nn.Module]:
    """The class registered as ``name``; an unknown name lists the known ones."""
    key = name.lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise ValueError(
            f"unknown fusion module {name!r}; available: {', '.join(available())}"
        )
    return _REGISTRY[key]


def create(name: str, **kwargs: Any) -> nn.Module:
    """Build the fusion module registered as ``name`` with keyword arguments ``kwargs``."""
    return get(name)(**kwargs)
