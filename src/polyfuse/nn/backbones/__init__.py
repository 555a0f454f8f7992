"""Backbones: models that encode the modalities themselves (the two settings of
MAN appendix H.1) and take any registered fusion module as an extra module.

:func:`available` lists them, :func:`create` builds one.
"""

from polyfuse.nn.backbones.common import check_backbone_inputs, extra_module_inputs, pool_steps
from polyfuse.nn.backbones.lstm_lmf import LSTMLMF
from polyfuse.nn.backbones.mult import MulT
from polyfuse.nn.backbones.registry import available, create, get, register
from polyfuse.nn.backbones.transformer import (
    CrossmodalAttention,
    CrossmodalEncoder,
    CrossmodalLayer,
)

__all__ = [
    "LSTMLMF",
    "CrossmodalAttention",
    "CrossmodalEncoder",
    "CrossmodalLayer",
    "MulT",
    "available",
    "check_backbone_inputs",
    "create",
    "extra_module_inputs",
    "get",
    "pool_steps",
    "register",
]
