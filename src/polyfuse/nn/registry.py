"""A registry of fusion modules: every module behind the common interface has a name.

>>> import polyfuse
>>> "man" in polyfuse.nn.available()
True
>>> fusion = polyfuse.nn.create("concat", input_dims=[8, 4], out_dim=16)

:class:`Registry` is the mechanism; the backbones (:mod:`polyfuse.nn.backbones`)
keep a second instance of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

__all__ = ["Registry", "available", "create", "get", "register"]

ModuleType = TypeVar("ModuleType", bound=type[nn.Module])


class Registry:
    """Named module classes: ``kind`` names them in messages ("fusion module"),
    ``unknown_hint`` is appended to the message for an unknown name."""

    def __init__(self, kind: str, unknown_hint: str = "") -> None:
        self.kind = kind
        self.unknown_hint = unknown_hint
        self._classes: dict[str, type[nn.Module]] = {}

    def register(self, name: str) -> Callable[[ModuleType], ModuleType]:
        """Class decorator that adds a class under ``name`` (stored as ``cls.registry_name``)."""

        def decorator(cls: ModuleType) -> ModuleType:
            key = name.lower()
            if key in self._classes and self._classes[key] is not cls:
                raise ValueError(f"{self.kind} name {key!r} is already registered")
            self._classes[key] = cls
            cls.registry_name = key
            return cls

        return decorator

    def available(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._classes)

    def get(self, name: str) -> type[nn.Module]:
        """The class registered as ``name``; an unknown name lists the known ones."""
        key = name.lower() if isinstance(name, str) else name
        if key not in self._classes:
            raise ValueError(
                f"unknown {self.kind} {name!r}; available: {', '.join(self.available())}{self.unknown_hint}"
            )
        return self._classes[key]

    def create(self, name: str, **kwargs: Any) -> nn.Module:
        """Build the class registered as ``name`` with keyword arguments ``kwargs``."""
        return self.get(name)(**kwargs)


FUSIONS = Registry("fusion module")
register = FUSIONS.register
available = FUSIONS.available
get = FUSIONS.get
create = FUSIONS.create
