"""Tiny synthetic video clips written with PyAV for the video extraction tests."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest


def write_clip(
    path: Path,
    frames: np.ndarray,
    *,
    fps: int = 10,
    codec: str = "libx264",
    audio: np.ndarray | None = None,
    audio_rate: int = 16_000,
) -> Path:
    """Encode ``frames`` (F, H, W, 3) uint8 as a clip (H.264 at high quality by default,
    ``ffv1`` for lossless), with ``audio`` (samples,) float in [-1, 1] as a mono
    PCM track when given."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = {"libx264": "yuv444p", "ffv1": "bgr0"}.get(codec, "yuv420p")  # bgr0: lossless RGB
        if codec == "libx264":
            stream.options = {"crf": "0", "preset": "ultrafast"}
        sound = None
        if audio is not None:
            sound = container.add_stream("pcm_s16le", rate=audio_rate, layout="mono")
        for image in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
        if sound is not None:
            pcm = np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)
            chunk = 1024
            for start in range(0, len(pcm), chunk):
                piece = av.AudioFrame.from_ndarray(pcm[None, start : start + chunk], format="s16", layout="mono")
                piece.sample_rate = audio_rate
                piece.pts = start
                piece.time_base = Fraction(1, audio_rate)
                container.mux(sound.encode(piece))
            container.mux(sound.encode())
    return path


def index_coloured_frames(count: int, size: int = 32) -> np.ndarray:
    """(count, size, size, 3) uint8 frames whose colour tells their index: grey level 8 * i."""
    levels = (8 * np.arange(count)).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, size, size, 3)).copy()


def index_of_frames(frames: np.ndarray) -> np.ndarray:
    """The index encoded by ``index_coloured_frames`` in each decoded frame."""
    return np.round(frames.reshape(len(frames), -1).mean(axis=1) / 8).astype(np.int64)


def moving_square_frames(count: int, *, step: int, size: int = 64, side: int = 16, seed: int = 0) -> np.ndarray:
    """(count, size, size, 3) uint8: a textured square on a textured background that moves
    ``step`` pixels to the right at each frame (``step=0``: a static clip)."""
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 256, (size, size), dtype=np.uint8)
    background = np.repeat(np.repeat(background[::4, ::4], 4, 0), 4, 1)  # 4 x 4 blocks: smooth enough to track
    texture = rng.integers(0, 256, (side // 2, side // 2), dtype=np.uint8)
    texture = np.repeat(np.repeat(texture, 2, 0), 2, 1)
    frames = np.empty((count, size, size, 3), dtype=np.uint8)
    top = (size - side) // 2
    for i in range(count):
        image = background.copy()
        left = 8 + i * step
        image[top : top + side, left : left + side] = texture
        frames[i] = image[..., None]
    return frames


@pytest.fixture
def clips() -> SimpleNamespace:
    """The helpers above, for the test files of this folder."""
    return SimpleNamespace(
        write=write_clip,
        index_coloured=index_coloured_frames,
        index_of=index_of_frames,
        moving_square=moving_square_frames,
    )
