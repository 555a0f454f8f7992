"""Decoding video clips with PyAV: uniform frame sampling and the audio track.

A clip of ``F`` decoded frames is cut into ``N`` equal segments and the frame at the
centre of each segment is kept: frame ``floor((k + 1/2) F / N)`` for ``k = 0 .. N-1``.
When ``F < N`` some frames are repeated, so the result always has ``N`` rows. The frame
count is read from the container's header; when the header has none, or decoding finds
a different count (a truncated file), the clip is decoded again with the true count,
so the indices are always those of the frames that can actually be decoded. Decoding
stops at the first damaged packet after at least one good frame (a cut tail). A clip
whose header announces ``F`` frames of which fewer than :data:`MIN_DECODED_FRACTION`
(half) can be decoded is refused (``ValueError`` naming the file and both counts: the
extractors skip it); one with fewer than ``F`` but at least half is kept, and the
extractors say how many were decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "AUDIO_SAMPLE_RATE",
    "MIN_DECODED_FRACTION",
    "ClipInfo",
    "clip_info",
    "decode_audio",
    "frame_indices",
    "read_frames_at",
    "sample_frames",
]

AUDIO_SAMPLE_RATE = 16_000  # Hz, mono: the rate of the audio features
#: the least fraction of the frames a clip's header announces that must decode
MIN_DECODED_FRACTION = 0.5


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise ValueError("video decoding needs PyAV (pip install 'polyfuse[video]')") from None
    return av


def decode_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "this file cannot be decoded" (PyAV's and the OS's)."""
    return (_av().FFmpegError, OSError, ValueError, EOFError)


@dataclass(frozen=True)
class ClipInfo:
    """What the container says about a clip: the header's frame count (0 when unknown),
    frames per second (0.0 when unknown), the frame size and whether it has audio."""

    frames_in_header: int
    fps: float
    width: int
    height: int
    has_audio: bool


def _open(path: Path, threads: int | None) -> tuple[Any, Any]:
    av = _av()
    container = av.open(str(path))
    if not container.streams.video:
        container.close()
        raise ValueError(f"{path}: the file has no video stream")
    stream = container.streams.video[0]
    if threads:
        stream.thread_count = threads
    return container, stream


def clip_info(path: str | Path) -> ClipInfo:
    """The header information of a clip; ``ValueError`` (or PyAV's error) when unreadable."""
    container, stream = _open(Path(path), None)
    try:
        rate = stream.average_rate or stream.guessed_rate
        return ClipInfo(
            frames_in_header=int(stream.frames or 0),
            fps=float(rate) if rate else 0.0,
            width=int(stream.codec_context.width),
            height=int(stream.codec_context.height),
            has_audio=bool(container.streams.audio),
        )
    finally:
        container.close()


def frame_indices(total: int, count: int) -> np.ndarray:
    """``(count,)`` int64: the centre frame of each of ``count`` equal segments of ``total``
    frames, ``floor((k + 1/2) * total / count)``; repeated indices when ``total < count``."""
    if total < 1:
        raise ValueError(f"a clip needs at least one frame, got {total}")
    if count < 1:
        raise ValueError(f"the number of sampled frames must be >= 1, got {count}")
    return (2 * np.arange(count, dtype=np.int64) + 1) * total // (2 * count)


def _decode_wanted(
    path: Path, wanted: Mapping[int, bool], convert: Callable[[int, Any, bool], Any], threads: int | None
) -> tuple[dict[int, Any], int]:
    """Decode every frame in order, ``convert(index, frame, wanted[index])`` those in
    ``wanted``; returns the converted frames by index and the number of frames decoded."""
    container, stream = _open(path, threads)
    kept: dict[int, Any] = {}
    decoded = 0
    try:
        for frame in container.decode(stream):
            if decoded in wanted:
                kept[decoded] = convert(decoded, frame, wanted[decoded])
            decoded += 1
    except _av().FFmpegError:
        if decoded == 0:
            raise
        # a damaged or cut tail: the frames before it are the clip (the caller compares counts)
    finally:
        container.close()
    return kept, decoded


def read_frames_at(
    path: str | Path,
    count: int,
    convert: Callable[[int, Any, bool], Any],
    *,
    extra: Callable[[np.ndarray, int], Iterable[int]] | None = None,
    threads: int | None = None,
) -> tuple[np.ndarray, int, dict[int, Any]]:
    """Sample ``count`` frames of a clip uniformly (module docstring) and convert them.

    ``convert(index, frame, sampled)`` turns a PyAV frame into what the caller keeps
    (``sampled`` is false for a frame that is only one of the extras); ``extra(indices,
    total)`` names more frames to convert (for example each sampled frame's successor).
    Returns the sampled indices ``(count,)``, the clip's decoded frame count and
    ``{index: converted}`` for the sampled and extra frames.
    """
    path = Path(path)
    total = announced = clip_info(path).frames_in_header
    if total <= 0:  # no count in the header: count by decoding
        total = _decode_wanted(path, {}, convert, threads)[1]
        if total == 0:
            raise ValueError(f"{path}: no frame could be decoded")
    for _ in range(2):
        indices = frame_indices(total, count)
        wanted = dict.fromkeys(extra(indices, total) if extra is not None else (), False)
        wanted.update(dict.fromkeys(indices.tolist(), True))
        kept, decoded = _decode_wanted(path, wanted, convert, threads)
        if decoded == 0:
            raise ValueError(f"{path}: no frame could be decoded")
        if announced > 0 and decoded < MIN_DECODED_FRACTION * announced:
            raise ValueError(
                f"{path}: only {decoded} of the {announced} frames its header announces could be decoded, "
                f"under {MIN_DECODED_FRACTION:.0%} (a truncated file?)"
            )
        if decoded == total:
            return indices, total, kept
        total = decoded  # the header was wrong: sample again among the frames that exist
    raise ValueError(f"{path}: the number of decodable frames changes between two reads")


def _rgb(_: int, frame: Any, __: bool) -> np.ndarray:
    return frame.to_ndarray(format="rgb24")


def sample_frames(path: str | Path, count: int, *, threads: int | None = None) -> np.ndarray:
    """``count`` frames sampled uniformly from a clip: ``(count, H, W, 3)`` uint8 RGB at the
    clip's own size, frame ``floor((k + 1/2) F / count)`` of the ``F`` frames in row ``k``.

    Raises ``ValueError`` naming the file when it cannot be decoded.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file {path} does not exist")
    try:
        indices, _, kept = read_frames_at(path, count, _rgb, threads=threads)
    except decode_errors() as error:
        if str(error).startswith(str(path)):
            raise
        raise ValueError(f"{path}: cannot decode the clip ({error})") from error
    return np.stack([kept[i] for i in indices.tolist()])


def decode_audio(path: str | Path, *, sample_rate: int = AUDIO_SAMPLE_RATE) -> np.ndarray | None:
    """The first audio track as ``(samples,)`` float32 mono at ``sample_rate`` Hz, or ``None``
    when the clip has no audio track (or an empty one)."""
    av = _av()
    container = av.open(str(path))
    try:
        if not container.streams.audio:
            return None
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        chunks: list[np.ndarray] = []
        for frame in container.decode(container.streams.audio[0]):
            chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(frame))
        chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
    finally:
        container.close()
    if not chunks:
        return None
    samples = np.concatenate(chunks).astype(np.float32)
    return samples if samples.size else None
