"""The real CMU-MOSI file (skipped when absent): split_bclstm splits, validation
videos carved from the training videos, contextual windows within videos."""

import os
from pathlib import Path

import numpy as np
import pytest

from polyfuse.data import load_arrays, prepare_data

MOSI = Path(
    os.environ.get("POLYFUSE_MOSI_PATH", Path(__file__).resolve().parents[2] / "../shared/data/mosi/mosi_utterance.npz")
)
pytestmark = pytest.mark.skipif(not MOSI.is_file(), reason=f"CMU-MOSI file not found at {MOSI} (set POLYFUSE_MOSI_PATH)")

CONFIG = {
    "modalities": ["text", "audio", "video"],
    "split": "split_bclstm",
    "context": {"group_by": "video_id", "order_by": "start", "window": 16},
    "validation_fraction": 0.15,
}


@pytest.fixture(scope="module")
def mosi():
    table = load_arrays(MOSI)
    return table, prepare_data(table, CONFIG, {"type": "sentiment"}, label_kind="score")


def test_split_bclstm_partitions(mosi):
    table, data = mosi
    split, video = table.arrays["split_bclstm"], table.arrays["video_id"]
    parts = data.splits
    assert len(parts["test"]) == 752
    assert len(parts["train"]) + len(parts["val"]) == 1447
    np.testing.assert_array_equal(parts["test"].rows, np.flatnonzero(split == "test"))
    assert (split[parts["val"].rows] == "train").all()  # validation comes from the training split
    train_videos, valid_videos = set(video[parts["train"].rows]), set(video[parts["val"].rows])
    assert not train_videos & valid_videos
    assert len(valid_videos) == round(0.15 * 62)
    assert data.input_dims == [100, 73, 100]


def test_windows_are_ordered_utterances_of_the_same_video(mosi):
    table, data = mosi
    video, start = table.arrays["video_id"], table.arrays["start"]
    part = data.splits["test"]
    assert part.windows.shape == (752, 16)
    for row, window, centre in zip(part.rows, part.windows, part.centre, strict=True):
        members = window[window >= 0]
        assert window[centre] == row
        assert (video[members] == video[row]).all()
        assert np.all(np.diff(start[members]) >= 0)
        assert len(members) == min(16, int((video[part.rows] == video[row]).sum()))


def test_standardised_with_training_statistics(mosi):
    _, data = mosi
    audio = data.features[1][data.splits["train"].rows, 0]
    np.testing.assert_allclose(audio.mean(axis=0), 0.0, atol=1e-4)
    assert np.abs(data.features[1]).max() < 1e3  # raw audio reaches ~376 before scaling
