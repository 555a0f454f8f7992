"""data.padding on npz files: left / right padding is applied (real steps found from the
zero padding and moved to the front), never silently ignored; it excludes a lengths array."""

import numpy as np
import pytest

from polyfuse.data import load_source, prepare_data


def left_padded(path, *, with_lengths=False):
    steps, rows = 4, 6
    x = np.zeros((rows, steps, 2), dtype=np.float32)
    lengths = np.array([4, 3, 2, 1, 0, 2])
    for row, length in enumerate(lengths):
        x[row, steps - length:] = np.arange(1, 2 * length + 1, dtype=np.float32).reshape(length, 2) + 10 * row
    arrays = {"x": x, "y": np.ones((rows, 3), np.float32), "label": np.linspace(-1, 1, rows).astype(np.float32),
              "split": np.array(["train", "train", "train", "train", "val", "test"])}
    if with_lengths:
        arrays["x_lengths"] = lengths
    np.savez(path, **arrays)
    return x, lengths


DATA = {"modalities": ["x", "y"], "split": "split", "standardize": False}


def test_left_padding_is_applied_to_an_npz(tmp_path):
    x, lengths = left_padded(tmp_path / "f.npz")
    table = load_source(str(tmp_path / "f.npz"))
    prepared = prepare_data(table, {**DATA, "padding": "left"}, {"type": "sentiment"}, label_kind="score")
    np.testing.assert_array_equal(prepared.lengths[0], lengths)
    for row, length in enumerate(lengths):  # by hand: the last `length` steps, now first, then zeros
        np.testing.assert_array_equal(prepared.features[0][row, :length], x[row, 4 - length:])
        assert not prepared.features[0][row, length:].any()
    # auto (the default) reads the generic layout: every step real, nothing moved
    prepared = prepare_data(table, DATA, {"type": "sentiment"}, label_kind="score")
    np.testing.assert_array_equal(prepared.lengths[0], [4] * 6)
    np.testing.assert_array_equal(prepared.features[0], x)


def test_padding_and_a_lengths_array_are_refused_together(tmp_path):
    left_padded(tmp_path / "g.npz", with_lengths=True)
    table = load_source(str(tmp_path / "g.npz"))
    with pytest.raises(ValueError, match=r"g\.npz: data\.padding: right and the array 'x_lengths' both say"):
        prepare_data(table, {**DATA, "padding": "right"}, {"type": "sentiment"}, label_kind="score")
