"""Training and evaluation with Lightning: configuration, builders, safetensors
checkpoints, seeding, runs, comparisons over seeds and plots.

The names below are imported on first use, so that ``import polyfuse.engine``
(and the ``polyfuse`` command's start-up) does not pay for Lightning until it is needed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DEFAULTS": "polyfuse.engine.config",
    "apply_overrides": "polyfuse.engine.config",
    "load_config": "polyfuse.engine.config",
    "resolve_config": "polyfuse.engine.config",
    "SafetensorsCheckpointIO": "polyfuse.engine.checkpoints",
    "SafetensorsModelCheckpoint": "polyfuse.engine.checkpoints",
    "read_checkpoint": "polyfuse.engine.checkpoints",
    "write_checkpoint": "polyfuse.engine.checkpoints",
    "compare": "polyfuse.engine.compare",
    "format_summary": "polyfuse.engine.compare",
    "parse_models": "polyfuse.engine.compare",
    "summarise": "polyfuse.engine.compare",
    "AppliedCheckpoint": "polyfuse.engine.run",
    "RunResult": "polyfuse.engine.run",
    "apply_checkpoint": "polyfuse.engine.run",
    "evaluate": "polyfuse.engine.run",
    "evaluate_applied": "polyfuse.engine.run",
    "load_model": "polyfuse.engine.run",
    "predict": "polyfuse.engine.run",
    "train": "polyfuse.engine.run",
    "ReseedEachEpoch": "polyfuse.engine.seeding",
    "seed_everything": "polyfuse.engine.seeding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'polyfuse.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
