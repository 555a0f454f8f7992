"""Configurations on polyfuse's synthetic sequence data (``data.source: synthetic:...``):
nothing to write, every run trains in seconds."""

from __future__ import annotations

from pathlib import Path

from polyfuse.engine.config import deep_merge

#: a 2-epoch classification run over three modalities (MAN fusion; BAN's input groups
#: set for the tests that switch to it), without ``output_dir`` (the command-line tests)
CLI_CONFIG = {
    "task": {"type": "classification"},
    "data": {"source": "synthetic:samples=160,lengths=6/7/8,dims=4/3/5", "batch_size": 16, "validation_fraction": 0.2},
    "model": {
        "fusion": "man", "fusion_dim": 8, "out_dim": 8,
        "encoder": {"type": "linear", "hidden_dim": 8},
        "options": {"man": {"hidden_dim": 8, "heads": 2, "num_random_features": 8}, "ban": {"glimpses": 2}},
        "input_groups": {"ban": [["m0"], ["m1"]]},
    },
    "trainer": {"max_epochs": 2, "accelerator": "cpu", "num_threads": 1, "patience": 0},
}


def engine_config(folder: Path, **sections) -> dict:
    """A 3-epoch classification run (MAN fusion, dropout, a learnable signal) writing under
    ``folder / "runs"``; ``sections`` are merged over it (:func:`deep_merge`)."""
    config = {
        "output_dir": str(folder / "runs"),
        "task": {"type": "classification"},
        "data": {
            "source": "synthetic:samples=200,lengths=6/7/8,dims=4/3/5,signal=4.0",
            "batch_size": 16,
            "validation_fraction": 0.2,
        },
        "model": {
            "fusion": "man",
            "fusion_dim": 8,
            "out_dim": 8,
            "dropout": 0.1,
            "encoder": {"type": "linear", "hidden_dim": 8, "dropout": 0.1},
            "options": {"man": {"hidden_dim": 8, "heads": 2, "num_random_features": 8, "chunks": 4}},
        },
        "optim": {"lr": 0.01},
        "trainer": {
            "max_epochs": 3, "accelerator": "cpu", "progress_bar": False, "quiet": True,
            "num_threads": 1, "patience": 0,
        },
    }
    return deep_merge(config, sections)
