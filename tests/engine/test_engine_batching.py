"""Predictions do not depend on how samples are batched: batches are cut to their
longest real sequence, so each batch size pads differently, and a padding-invariant
model must give the same outputs (MAN sized as on CMU-MOSI, in eval mode)."""

import pytest
import torch

from polyfuse.data.datamodule import FusionDataModule
from polyfuse.engine import resolve_config, seed_everything
from polyfuse.tasks.registry import task_spec


def build_task(config, input_dims, names, label_info):
    """The task module of config's task type around a new backbone."""
    return task_spec(config["task"]["type"]).module_for(config, input_dims, names, label_info)


@pytest.mark.parametrize(
    ("fusion", "options"),
    [
        ("man", {"hidden_dim": 40, "heads": 10, "num_random_features": 24, "chunks": 4, "mode": "had"}),
        ("man", {"hidden_dim": 40, "heads": 10, "num_random_features": 24, "chunks": 4, "mode": "exact"}),
        ("tfn", {}),
    ],
)
def test_predictions_do_not_depend_on_the_batch_size(tiny_config, fusion, options):
    config = resolve_config(tiny_config(
        data={"source": "synthetic:samples=400,lengths=12/12/12,dims=4/3/5,min_length_fraction=0.3"},
        model={"fusion": fusion, "options": {fusion: options}},
    ))
    seed_everything(0)
    data = task_spec(config["task"]["type"]).build_data(config).prepared
    task = build_task(config, data.input_dims, data.modalities, data.label_info).eval()
    outputs = {}
    for batch_size in (400, 7):
        loader = FusionDataModule(data, batch_size=16, eval_batch_size=batch_size).loader("train")
        with torch.no_grad():
            outputs[batch_size] = torch.cat([task(batch) for batch in loader])
    torch.testing.assert_close(outputs[400], outputs[7], rtol=1e-4, atol=1e-5)
