"""The motion stream: optical flow of a square that moves a known distance, zero on a
static clip, and the flow histogram against a pixel-by-pixel loop over its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("cv2")

from polyfuse.extract.motion import (
    MOTION_DIM,
    dense_flow,
    flow_descriptor,
    flow_frame,
    motion_partners,
)


def test_flow_frame_resizes_the_shorter_side_and_greys():
    rgb = np.zeros((48, 96, 3), dtype=np.uint8)
    rgb[..., 1] = 200  # pure green: grey = 0.587 * 200 (ITU-R BT.601)
    grey = flow_frame(rgb, 32)
    assert grey.shape == (32, 64)
    assert grey.dtype == np.uint8
    assert np.all(np.abs(grey.astype(int) - round(0.587 * 200)) <= 1)


@pytest.mark.parametrize("step", [1, 3])
def test_flow_of_a_square_moving_right(clips, step):
    frames = clips.moving_square(3, step=step, size=64, side=16)
    first, second = flow_frame(frames[0], 128), flow_frame(frames[1], 128)  # scale 2
    flow = dense_flow(first, second)
    assert flow.shape == (128, 128, 2)
    # the square's inside in frame 0 at flow resolution: rows 48..80, columns 16..48
    inside = flow[52:76, 20:44]
    assert np.median(inside[..., 0]) == pytest.approx(2 * step, abs=0.25)
    assert abs(np.median(inside[..., 1])) < 0.25
    outside = flow[:32]  # the static background above the square
    assert np.median(np.abs(outside)) < 0.05


def test_static_frames_have_almost_no_motion(clips):
    frames = clips.moving_square(2, step=0)
    grey = flow_frame(frames[0], 128)
    descriptor = flow_descriptor(dense_flow(grey, grey.copy()), fps=25.0)
    assert np.abs(descriptor).max() < 1e-2


def _descriptor_by_loops(flow, fps):
    """The module docstring's definition, one pixel at a time."""
    height, width = flow.shape[:2]
    histogram = np.zeros((4, 4, 8))
    pixels = np.zeros((4, 4))
    vx_all, vy_all, speeds = [], [], []
    for y in range(height):
        for x in range(width):
            vx, vy = flow[y, x, 0] * fps / width, flow[y, x, 1] * fps / height
            speed = math.hypot(vx, vy)
            angle = math.degrees(math.atan2(vy, vx)) % 360
            direction = int(((angle + 22.5) // 45) % 8)  # bin b covers [45 b - 22.5, 45 b + 22.5)
            row, col = y * 4 // height, x * 4 // width
            histogram[row, col, direction] += speed
            pixels[row, col] += 1
            vx_all.append(vx)
            vy_all.append(vy)
            speeds.append(speed)
    histogram /= pixels[..., None]
    return np.concatenate([histogram.ravel(), [np.mean(vx_all), np.mean(vy_all), np.mean(speeds), np.std(speeds)]])


def test_flow_descriptor_matches_its_definition():
    flow = np.random.default_rng(3).normal(0, 2, (18, 22, 2)).astype(np.float32)  # cells of unequal size
    got = flow_descriptor(flow, fps=12.5)
    assert got.shape == (MOTION_DIM,)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _descriptor_by_loops(flow, 12.5), rtol=1e-5, atol=1e-6)


def test_uniform_flow_fills_one_direction_bin():
    flow = np.zeros((16, 32, 2), dtype=np.float32)
    flow[..., 1] = 4.0  # 4 px per frame downwards on a 16-pixel-high image at 10 fps: 2.5 heights/s
    descriptor = flow_descriptor(flow, fps=10.0)
    histogram = descriptor[:128].reshape(16, 8)
    np.testing.assert_allclose(histogram[:, 2], 2.5, rtol=1e-6)  # bin 2: downwards
    np.testing.assert_allclose(np.delete(histogram, 2, axis=1), 0.0)
    np.testing.assert_allclose(descriptor[128:], [0.0, 2.5, 2.5, 0.0], atol=1e-6)


def test_flow_descriptor_refuses_bad_input():
    with pytest.raises(ValueError, match="smaller than"):
        flow_descriptor(np.zeros((3, 8, 2), dtype=np.float32), fps=25.0)
    with pytest.raises(ValueError, match="fps"):
        flow_descriptor(np.zeros((8, 8, 2), dtype=np.float32), fps=0.0)
    with pytest.raises(ValueError, match="different sizes"):
        dense_flow(np.zeros((8, 8), np.uint8), np.zeros((8, 9), np.uint8))


def test_motion_partners_are_the_next_frame_or_the_previous_at_the_end():
    assert motion_partners(np.array([0, 4, 9]), 10).tolist() == [1, 5, 8]
    assert motion_partners(np.array([0, 0]), 1).tolist() == [0, 0]
