"""polyfuse: high-order multimodal fusion for PyTorch.

``polyfuse.functional`` holds the pure tensor math (multi-linear and bilinear
attention, random features, ...); ``polyfuse.nn`` holds the modules that own
parameters, all behind one interface and one registry.

The subpackages are imported on first use (PEP 562), so ``import polyfuse`` does
not pay for torch until ``polyfuse.nn`` or ``polyfuse.functional`` is touched.
"""

import importlib
from typing import Any

__all__ = ["functional", "get_validation", "nn", "set_validation", "validation"]
__version__ = "0.4.0"

_SUBPACKAGES = ("functional", "nn")
_FROM_CHECKS = ("get_validation", "set_validation", "validation")  # see polyfuse._checks


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"polyfuse.{name}")
    elif name in _FROM_CHECKS:
        value = getattr(importlib.import_module("polyfuse._checks"), name)
    else:
        raise AttributeError(f"module 'polyfuse' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
