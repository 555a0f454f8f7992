"""Fusion modules: they own parameters and buffers and call :mod:`polyfuse.functional`.

Every fusion module implements ``forward(inputs, masks=None) -> (B, out_dim)`` (see
:class:`FusionModule`) and is registered by name: :func:`available` lists the names,
:func:`create` builds one.
"""

from polyfuse.nn.base import FusionModule
from polyfuse.nn.baselines import LMF, TFN, Concat
from polyfuse.nn.man import MAN, MANOutput, MultiLinearAttentionLayer
from polyfuse.nn.registry import available, create, get, register

__all__ = [
    "LMF",
    "MAN",
    "TFN",
    "Concat",
    "FusionModule",
    "MANOutput",
    "MultiLinearAttentionLayer",
    "available",
    "create",
    "get",
    "register",
]
