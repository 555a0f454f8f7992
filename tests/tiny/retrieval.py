"""A tiny ``task.type retrieval`` configuration on polyfuse's synthetic retrieval set
(60 videos of two steps, bag-of-words captions, MAN fusion): nothing to write."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import TRAINER


def retrieval_config(folder: Path) -> dict:
    """The configuration, writing under ``folder / "runs"``."""
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "retrieval"},
        "retrieval": {"source": "synthetic:videos=60,steps=2,events=2,dim=4", "text": "bow",
                      "embed_dim": 8, "hidden_dim": 8},
        "model": {"fusion": "man"},
        "data": {"batch_size": 8, "eval_batch_size": 16},
        "trainer": dict(TRAINER),
    }
