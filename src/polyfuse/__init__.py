"""polyfuse: high-order multimodal fusion for PyTorch.

``polyfuse.functional`` holds the pure tensor math (multi-linear and bilinear
attention, random features, ...); ``polyfuse.nn`` holds the modules that own
parameters, all behind one interface and one registry.
"""

from polyfuse import functional, nn

__all__ = ["functional", "nn"]
__version__ = "0.1.0"
