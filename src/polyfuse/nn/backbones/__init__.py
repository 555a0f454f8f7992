"""Backbones: the model a task's head sits on, chosen by ``model.backbone``.

``fusion`` (the default, :class:`FusionBackbone`): per-modality encoders around one
fusion module. The registered ones encode the modalities themselves (the two settings
of MAN appendix H.1) and take any registered fusion module as an extra module:
:func:`available` lists them, :func:`create` builds one.
"""

from polyfuse.nn.backbones.common import check_backbone_inputs, extra_module_inputs, pool_steps
from polyfuse.nn.backbones.fusion import ENCODER_TYPES, FusionBackbone, ModalityEncoder
from polyfuse.nn.backbones.lstm_lmf import LSTMLMF
from polyfuse.nn.backbones.mult import MulT
from polyfuse.nn.backbones.registry import available, create, get, register
from polyfuse.nn.backbones.transformer import (
    CrossmodalAttention,
    CrossmodalEncoder,
    CrossmodalLayer,
)

__all__ = [
    "ENCODER_TYPES",
    "LSTMLMF",
    "CrossmodalAttention",
    "CrossmodalEncoder",
    "CrossmodalLayer",
    "FusionBackbone",
    "ModalityEncoder",
    "MulT",
    "available",
    "check_backbone_inputs",
    "create",
    "extra_module_inputs",
    "get",
    "pool_steps",
    "register",
]
