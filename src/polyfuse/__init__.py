"""polyfuse: high-order multimodal fusion for PyTorch.

``polyfuse.functional`` holds the pure tensor math (multi-linear and bilinear
attention, random features, ...); ``polyfuse.nn`` holds the modules that own
parameters, all behind one interface and one registry.

The subpackages are imported on first use (PEP 562), so ``import polyfuse`` does
not pay for torch until ``polyfuse.nn`` or ``polyfuse.functional`` is touched.
"""

import importlib
from typing import Any

__all__ = ["functional", "nn"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = importlib.import_module(f"polyfuse.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'polyfuse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
