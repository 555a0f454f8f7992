"""A tiny synthetic configuration file for the command-line tests."""

import pytest
import yaml

TINY = {
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


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "output_dir": str(tmp_path / "runs")}))
    return path
