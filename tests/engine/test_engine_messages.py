"""Messages name what is wrong, in the words of the user who met it."""

import numpy as np
import pytest
import torch

from polyfuse.data import load_arrays, prepare_data
from polyfuse.data.sources import parse_synthetic
from polyfuse.engine.config import resolve_config
from polyfuse.nn import HOCAFusion
from polyfuse.tasks.attention_figure import sample_title
from polyfuse.tasks.building import build_backbone


def test_a_limit_reached_from_a_config_names_the_config_key():
    config = resolve_config({"model": {"fusion": "tfn", "options": {"tfn": {"max_fused_size": 10}}}})
    with pytest.raises(ValueError, match=r"above max_fused_size = 10 .*\[in a configuration: model\.options\.tfn\.hidden_dims, model\.options\.tfn\.max_fused_size\]$"):
        build_backbone(config, [4, 3, 5], ["a", "b", "c"])


def test_hoca_adapter_errors_name_the_hoca_module():
    module = HOCAFusion([3, 4], 5, max_lengths=4)
    with pytest.raises(ValueError, match=r"^HOCAFusion: modality 0 has 6 time steps"):
        module([torch.randn(2, 6, 3), torch.randn(2, 4, 4)])
    with pytest.raises(ValueError, match=r"^HOCAFusion: modality 1 has feature size 2"):
        module([torch.randn(2, 3, 3), torch.randn(2, 4, 2)])


def test_nan_is_never_a_class(tmp_path):
    split = np.array(["train"] * 4 + ["val"] * 2 + ["test"] * 2)
    path = tmp_path / "f.npz"

    def prepare(labels):
        np.savez(path, x=np.ones((8, 2), np.float32), label=np.array(labels), split=split)
        return prepare_data(load_arrays(path), {"modalities": ["x"], "split": "split"}, {"type": "classification"}, label_kind="class")

    with pytest.raises(ValueError, match=r"the label of row 1 is not finite \(NaN / Inf\); it cannot be a class"):
        prepare([0.0, np.nan, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"row 7 has no label \(NaN\) or a class .* \(classes: \[0\.0, 1\.0\]\)$"):
        prepare([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, np.nan])
    assert prepare([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]).label_info == {"classes": [0.0, 1.0]}


def test_synthetic_options_are_range_checked():
    for spec, message in [
        ("synthetic:dims=-3/4", "dims must be positive integers, got -3/4"),
        ("synthetic:samples=10000000000", r"samples must lie in \[10, 10000000\]"),
        ("synthetic:seed=99999999999", r"seed must lie in \[0, 4294967295\]"),
        ("synthetic:samples=1000000,lengths=100,dims=100", "feature values .* exceed 500,000,000"),
        ("synthetic:noise=x", "synthetic option noise='x' is not a valid number"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_synthetic(spec)


def test_long_plot_titles_wrap_instead_of_being_cut():
    values = ", ".join(f"{0.123 * i:.3g}" for i in range(17))
    text = f"test sample 0 (row 12): prediction [{values}], label [{values}]"
    title = sample_title(text)
    lines = title.splitlines()
    assert len(lines) > 1 and all(len(line) <= 90 for line in lines)
    assert " ".join(lines) == text  # nothing dropped
