"""A registry of backbones: models that encode the modalities themselves and take
any registered fusion module of :mod:`polyfuse.nn` as an extra module.

>>> from polyfuse.nn import backbones
>>> backbones.available()
['lstm_lmf', 'mult']
"""

from __future__ import annotations

from polyfuse.nn.registry import Registry

__all__ = ["BACKBONES", "available", "create", "get", "register"]

BACKBONES = Registry("backbone", unknown_hint=" (or 'fusion')")
register = BACKBONES.register
available = BACKBONES.available
get = BACKBONES.get
create = BACKBONES.create
