"""The motion stream: dense optical flow statistics per segment (a histogram of flow).

For each sampled frame ``i`` of a clip (one per segment, ``decode.frame_indices``) the
dense optical flow from frame ``i`` to frame ``i + 1`` (from ``i - 1`` to ``i`` for the
last frame of a clip) is computed with Farnebäck's method (OpenCV,
``calcOpticalFlowFarneback``) on the grey frames resized so that their shorter side is
``flow_size`` pixels. Why flow and not a CNN over frame differences: flow measures how far
and in which direction things move, in units that a test can check against a clip whose
motion is known, it is near zero on a static clip whatever its content (Farnebäck
returns up to about 0.1 px on identical frames, not 0), and it costs a few
milliseconds per frame pair on one core at 128 pixels; an ImageNet CNN has never seen
difference images and would add one more forward pass per frame.

The flow (pixels per frame) becomes a velocity in frame sizes per second,
``v = (u_x * fps / w, u_y * fps / h)`` for a flow image of ``w x h`` pixels, so that
clips of different sizes and frame rates are comparable. The descriptor of one frame
pair, ``MOTION_DIM = 4 * 4 * 8 + 4 = 132`` numbers, is a histogram of optical flow
(HOF, Laptev et al. 2008) without its normalisation:

- for each cell of a 4 x 4 grid over the frame (row-major) and each of 8 directions
  (bin ``b`` is centred at ``45 b`` degrees, measured from +x towards +y, image y
  pointing down, so bin 2 is downwards), the sum of ``|v|`` over the cell's pixels whose
  direction falls in the bin, divided by the cell's pixel count (128 numbers);
- then the mean ``v_x``, the mean ``v_y``, the mean ``|v|`` and the standard deviation of
  ``|v|`` over the frame (4 numbers).

Every number is near zero for a static clip (of order 1e-3 frame sizes per second:
at most 6.8e-4 on the tests' 64-pixel static clip at 10 fps, as Farnebäck finds up to
0.14 px of flow between identical frames), and the histogram of a cell sums to the
cell's mean speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "FLOW_GRID",
    "MOTION_DIM",
    "ORIENTATION_BINS",
    "dense_flow",
    "flow_descriptor",
    "flow_frame",
    "motion_partners",
    "opencv_version",
]

FLOW_GRID = 4
ORIENTATION_BINS = 8
MOTION_DIM = FLOW_GRID * FLOW_GRID * ORIENTATION_BINS + 4
# Farnebäck's parameters: pyramid scale, levels, window, iterations, poly_n, poly_sigma
# (the values of OpenCV's own optical flow sample).
FARNEBACK = {"pyr_scale": 0.5, "levels": 3, "winsize": 15, "iterations": 3, "poly_n": 5, "poly_sigma": 1.2}


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise ValueError(
            "the motion stream needs OpenCV (pip install 'polyfuse[video]', which brings "
            "opencv-python-headless)"
        ) from None
    return cv2


def opencv_version() -> str:
    """The version of the OpenCV that computes the flow (recorded in the feature file)."""
    return str(_cv2().__version__)


def flow_frame(rgb: np.ndarray, flow_size: int) -> np.ndarray:
    """``(H, W, 3)`` uint8 RGB -> ``(h, w)`` uint8 grey, resized (area averaging) so that
    its shorter side is ``flow_size`` pixels."""
    cv2 = _cv2()
    if flow_size < 16:
        raise ValueError(f"flow_size must be >= 16 pixels, got {flow_size}")
    grey = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    height, width = grey.shape
    scale = flow_size / min(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(grey, size, interpolation=cv2.INTER_AREA)


def dense_flow(previous: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Farnebäck dense optical flow between two ``(h, w)`` uint8 grey frames:
    ``(h, w, 2)`` float32, the displacement (x, y) in pixels of each pixel of ``previous``."""
    if previous.shape != current.shape:
        raise ValueError(f"two frames of different sizes: {previous.shape} and {current.shape}")
    cv2 = _cv2()
    flow = cv2.calcOpticalFlowFarneback(previous, current, None, flags=0, **FARNEBACK)
    return flow.astype(np.float32)


def motion_partners(indices: np.ndarray, total: int) -> np.ndarray:
    """``(N,)`` the frame paired with each sampled frame: the next one, or the previous one
    for the last frame of a clip (the frame itself for a one-frame clip)."""
    return np.where(indices + 1 < total, indices + 1, np.maximum(indices - 1, 0))


def flow_descriptor(flow: np.ndarray, fps: float) -> np.ndarray:
    """``(h, w, 2)`` flow in pixels per frame -> ``(MOTION_DIM,)`` float32 (module docstring)."""
    height, width = flow.shape[:2]
    if height < FLOW_GRID or width < FLOW_GRID:
        raise ValueError(f"a flow image of {height} x {width} pixels is smaller than the {FLOW_GRID} x {FLOW_GRID} grid")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    velocity_x = flow[..., 0].astype(np.float64) * fps / width
    velocity_y = flow[..., 1].astype(np.float64) * fps / height
    speed = np.hypot(velocity_x, velocity_y)
    angle = np.mod(np.arctan2(velocity_y, velocity_x), 2 * np.pi)
    direction = np.floor(angle / (2 * np.pi / ORIENTATION_BINS) + 0.5).astype(np.int64) % ORIENTATION_BINS
    cell_row = np.arange(height) * FLOW_GRID // height  # (h,) the grid row of each pixel row
    cell_col = np.arange(width) * FLOW_GRID // width
    cell = cell_row[:, None] * FLOW_GRID + cell_col[None, :]  # (h, w)
    slot = (cell * ORIENTATION_BINS + direction).ravel()
    histogram = np.bincount(slot, weights=speed.ravel(), minlength=FLOW_GRID**2 * ORIENTATION_BINS)
    pixels = np.bincount(cell.ravel(), minlength=FLOW_GRID**2)
    histogram = histogram.reshape(FLOW_GRID**2, ORIENTATION_BINS) / pixels[:, None]
    summary = [velocity_x.mean(), velocity_y.mean(), speed.mean(), speed.std()]
    return np.concatenate([histogram.ravel(), summary]).astype(np.float32)
