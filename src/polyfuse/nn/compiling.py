"""``torch.compile`` for polyfuse modules, set the way each compiles well.

Every registered fusion module compiles (``torch.compile``, default mode and
``mode="reduce-overhead"``), forward and backward, and agrees with its eager self (the
contract test). All but one kind trace as one graph (``fullgraph=True``). The exception
is a module that reads a modality with a recurrent network (TFN and LMF in their paper
form: :class:`~polyfuse.nn.modality_subnetworks.SequenceSubnetwork`): its LSTM is kept
out of the graph (``torch.compiler.disable``) so that it runs as one fused kernel
(cuDNN on CUDA); traced into the graph (dynamo's ``allow_rnn``) it is unrolled into
one cell per step, and compiled TFN and LMF then ran at 0.45x and 0.43x the speed of
eager forward+backward on an H100 (docs/BENCHMARKS.md, "torch.compile"). Such a module compiles in a few graphs
around the LSTM, so ``fullgraph=True`` cannot hold for it.

:func:`compile` is ``torch.compile`` with ``fullgraph`` chosen by
:func:`traces_as_one_graph`, which ``polyfuse bench compile`` and ``polyfuse bench gpu``
use too.

``mode="reduce-overhead"`` records CUDA graphs on CUDA (fixed shapes: a new shape
records a new graph). On the CPU there are no CUDA graphs: torch 2.13 compiles with
inductor as in the default mode and logs "skipping cudagraphs due to cpu device" (it
counts the skip in ``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``).
With CUDA graphs the outputs of one call are overwritten by the next: in a training
loop call ``torch.compiler.cudagraph_mark_step_begin()`` before each step, or clone
what must outlive it.
"""

from __future__ import annotations

import builtins
from typing import Any

import torch
from torch import nn

__all__ = ["compile", "traces_as_one_graph"]

#: ``torch.compile`` modes that ``compile`` passes on (None: the default mode).
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def traces_as_one_graph(module: nn.Module) -> bool:
    """Whether ``module`` compiles as one graph (``fullgraph=True``): False when it holds a
    recurrent network (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``), which polyfuse runs eagerly
    under ``torch.compile`` and which dynamo refuses to trace by default."""
    return not builtins.any(isinstance(child, nn.RNNBase) for child in module.modules())


def compile(module: nn.Module, *, fullgraph: bool | None = None, **options: Any) -> Any:
    """``torch.compile(module, fullgraph=..., **options)``, with ``fullgraph`` set to
    :func:`traces_as_one_graph` when not given (see the module docstring).

    Args:
        module: a polyfuse module (any ``nn.Module`` works).
        fullgraph: True fails on any graph break; None: True exactly when the module
            traces as one graph. True for a module that holds a recurrent network is
            refused (its LSTM is kept out of the graph on purpose).
        options: passed to ``torch.compile`` (``mode``, ``backend``, ``dynamic``, ...).

    Returns:
        The compiled module: called as the module is.
    """
    one_graph = traces_as_one_graph(module)
    if fullgraph and not one_graph:
        raise ValueError(
            f"{type(module).__name__} cannot compile with fullgraph=True: it reads a modality with a "
            "recurrent network, which polyfuse keeps out of the graph (torch.compiler.disable) so that "
            "it runs as one fused kernel; compile it with fullgraph=False (polyfuse.nn.compile's default)"
        )
    mode = options.get("mode")
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r}; expected one of {', '.join(map(str, COMPILE_MODES[1:]))}")
    # A fusion module caches whether a weight is float16 (read by its float16 guard);
    # filling the cache here, eagerly, keeps dynamo from walking the submodules (and the
    # LSTM among them) inside the graph.
    for child in module.modules():
        if hasattr(type(child), "float16_weights"):
            child.float16_weights  # noqa: B018
    return torch.compile(module, fullgraph=one_graph if fullgraph is None else fullgraph, **options)
