"""A tiny configuration on synthetic data: every engine test trains in seconds."""

import pytest

from polyfuse.engine.config import deep_merge


def tiny(tmp_path, **sections):
    config = {
        "output_dir": str(tmp_path / "runs"),
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


@pytest.fixture
def tiny_config(tmp_path):
    return lambda **sections: tiny(tmp_path, **sections)
