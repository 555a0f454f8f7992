"""Decoding clips with PyAV: frames sampled at the centres of equal segments (the index is
encoded in each frame's colour), the header's frame count, unreadable files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from polyfuse.extract.decode import clip_info, decode_audio, frame_indices
from polyfuse.extract.video import sample_frames


@pytest.mark.parametrize(("total", "count"), [(30, 5), (30, 30), (7, 3), (4, 9), (1, 3), (100, 80)])
def test_frame_indices_are_segment_centres(total, count):
    expected = []
    for k in range(count):  # the centre of segment k, [k total / count, (k + 1) total / count)
        centre = (k * total / count + (k + 1) * total / count) / 2
        expected.append(int(np.floor(centre + 1e-9)))
    assert frame_indices(total, count).tolist() == expected
    assert frame_indices(total, count).max() < total


def test_frame_indices_refuse_empty():
    with pytest.raises(ValueError, match="at least one frame"):
        frame_indices(0, 4)
    with pytest.raises(ValueError, match=">= 1"):
        frame_indices(10, 0)


@pytest.mark.parametrize("codec", ["libx264", "ffv1", "mpeg4"])
def test_sample_frames_takes_the_expected_frames(tmp_path, clips, codec):
    frames = clips.index_coloured(30)
    suffix = ".mkv" if codec == "ffv1" else ".avi"
    path = clips.write(tmp_path / f"clip{suffix}", frames, codec=codec)
    sampled = sample_frames(path, 4)
    assert sampled.dtype == np.uint8
    assert sampled.shape == (4, 32, 32, 3)
    assert clips.index_of(sampled).tolist() == [3, 11, 18, 26]  # floor((k + 1/2) 30 / 4)
    if codec == "ffv1":  # lossless: the pixels themselves
        np.testing.assert_array_equal(sampled, frames[[3, 11, 18, 26]])
        assert clip_info(path).frames_in_header == 0  # Matroska has no count: counted by decoding


def test_truncated_clip_is_sampled_among_the_frames_that_decode(tmp_path, clips):
    frames = clips.index_coloured(30, size=64)
    noise = np.random.default_rng(0).integers(-3, 4, frames.shape)  # so that frames have some bytes
    frames = np.clip(frames.astype(int) + noise, 0, 255).astype(np.uint8)
    whole = clips.write(tmp_path / "whole.avi", frames).read_bytes()
    path = tmp_path / "cut.avi"
    path.write_bytes(whole[: len(whole) // 2])
    assert clip_info(path).frames_in_header == 30  # the header still promises 30 frames
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        decodable = sum(1 for _ in container.decode(video=0))
    assert 0 < decodable < 30
    expected = [int((k + 0.5) * decodable / 4) for k in range(4)]
    assert clips.index_of(sample_frames(path, 4)).tolist() == expected


def test_short_clip_repeats_frames(tmp_path, clips):
    path = clips.write(tmp_path / "short.avi", clips.index_coloured(3))
    assert clips.index_of(sample_frames(path, 6)).tolist() == [0, 0, 1, 1, 2, 2]


def test_clip_info_and_no_audio(tmp_path, clips):
    path = clips.write(tmp_path / "clip.avi", clips.index_coloured(12), fps=12)
    info = clip_info(path)
    assert (info.frames_in_header, info.width, info.height, info.has_audio) == (12, 32, 32, False)
    assert info.fps == pytest.approx(12.0)
    assert decode_audio(path) is None


def test_unreadable_and_missing_files(tmp_path):
    broken = tmp_path / "broken.avi"
    broken.write_bytes(b"not a video" * 50)
    with pytest.raises(ValueError, match=r"broken\.avi: cannot decode"):
        sample_frames(broken, 4)
    with pytest.raises(FileNotFoundError, match=r"missing\.avi"):
        sample_frames(tmp_path / "missing.avi", 4)


MSVD = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "msvd"


@pytest.mark.skipif(not (MSVD / "clips_info.json").exists(), reason="the shared MSVD clips are absent")
@pytest.mark.parametrize("video_id", ["0lh_UWF9ZP4_27_31", "88DOMJ11q2M_84_87"])
def test_real_msvd_clips_match_the_data_builders_record(video_id):
    """clips_info.json was written by the data's build script (PyAV, full decode)."""
    record = json.loads((MSVD / "clips_info.json").read_text())[video_id]
    path = MSVD / "clips" / f"{video_id}.avi"
    info = clip_info(path)
    assert (info.frames_in_header, info.width, info.height) == (record["frames_decoded"], record["width"], record["height"])
    assert info.fps == pytest.approx(record["fps"], rel=1e-6)
    assert info.has_audio == (record["audio_streams"] > 0)
    frames = sample_frames(path, 3)
    assert frames.shape == (3, record["height"], record["width"], 3)
    assert frames.std() > 5  # real pictures, not blank frames
