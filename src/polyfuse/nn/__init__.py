"""Fusion modules: they own parameters and buffers and call :mod:`polyfuse.functional`.

Every fusion module implements ``forward(inputs, masks=None) -> (B, out_dim)`` (see
:class:`FusionModule`) and is registered by name: :func:`available` lists the names,
:func:`create` builds one; :func:`compile` compiles one with ``torch.compile`` the way
it compiles well (:mod:`polyfuse.nn.compiling`).
"""

from polyfuse.nn.ban import BAN
from polyfuse.nn.base import FusionModule, FusionOutput
from polyfuse.nn.baselines import LMF, TFN, Concat
from polyfuse.nn.chimera import (
    Chimera,
    ChimeraOutput,
    HyperbolicLayer,
    HyperbolicLayerOutput,
    MatchingLayer,
    TopicLayer,
    TopicLayerOutput,
)
from polyfuse.nn.compiling import compile, traces_as_one_graph
from polyfuse.nn.hoca import HOCA, BahdanauAttention, HOCAOutput, LowRankHOCA
from polyfuse.nn.maf import MAF, HOCAFusion, LowRankHOCAFusion, MAFFusion, MAFOutput
from polyfuse.nn.man import MAN, MultiLinearAttentionLayer
from polyfuse.nn.registry import available, create, get, register

__all__ = [
    "BAN",
    "HOCA",
    "LMF",
    "MAF",
    "MAN",
    "TFN",
    "BahdanauAttention",
    "Chimera",
    "ChimeraOutput",
    "Concat",
    "FusionModule",
    "FusionOutput",
    "HOCAFusion",
    "HOCAOutput",
    "HyperbolicLayer",
    "HyperbolicLayerOutput",
    "LowRankHOCA",
    "LowRankHOCAFusion",
    "MAFFusion",
    "MAFOutput",
    "MatchingLayer",
    "MultiLinearAttentionLayer",
    "TopicLayer",
    "TopicLayerOutput",
    "available",
    "compile",
    "create",
    "get",
    "register",
    "traces_as_one_graph",
]
