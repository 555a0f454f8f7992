"""Video captioning data: per-modality feature files keyed by video id, captions,
splits and the vocabulary (words as the caption metrics tokenise them:
:func:`polyfuse.text.ptb_tokenize`).

Feature files (one per modality; ``PATH#KEY`` picks a group or an array):

* ``.npz`` keyed by video id: one (T, d) array per video (``np.savez(f, **{id: x})``);
* ``.npz`` with an id array: ``video_ids`` (N,) and ``KEY`` (N, T, d), e.g. the shared
  MSVD ``features_vgg.npz#vgg``; an optional ``lengths`` (N,) array gives each video's
  real number of steps (the rest is padding);
* ``.h5`` / ``.hdf5``: one (T, d) dataset per video id at the root or in the group
  ``KEY`` (``polyfuse extract video`` writes ``appearance``, ``motion``, ``audio``
  groups: ``features.h5#motion``), or ``video_ids`` + ``KEY`` arrays as for npz.

A (d,) array (or an (N, d) array beside ``video_ids``) is one step. The files are read
lazily (:mod:`polyfuse.data.sequences`): the ids, lengths and sizes are checked when a
file is opened, the features are read a batch at a time (stored npz arrays as memory
maps), so that memory does not grow with the data set.

Captions: JSON ``{video_id: [caption, ...]}``; JSON ``[{"id": ..., "caption": [...]}]``
(the course MSVD files); MSR-VTT's ``{"sentences": [{"video_id", "caption"}]}``; or
CSV with the columns ``video_id`` and ``caption`` (one line per caption).
Splits: JSON ``{"train": [ids], "val": [ids], "test": [ids]}`` (``valid`` works too).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from polyfuse.data.formats.jsonfile import entry_field, json_list, read_json
from polyfuse.data.sequences import SequenceFile, open_sequences
from polyfuse.text import ptb_tokenize

__all__ = [
    "BEGIN",
    "END",
    "PAD",
    "UNKNOWN",
    "VideoFeatures",
    "Vocabulary",
    "load_captions",
    "load_splits",
    "load_video_features",
    "open_video_features",
]

PAD, BEGIN, END, UNKNOWN = "<pad>", "<bos>", "<eos>", "<unk>"

#: bytes of float32 features read at a time by a pass over many videos
CHUNK_BYTES = 64 << 20

# ---------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------


class VideoFeatures:
    """One modality: a (T, d) float32 array per video id, read from its file when asked
    for (:class:`polyfuse.data.sequences.SequenceFile`), every ``stride``-th step kept.
    NaN and Inf are refused per video as it is read, naming the file and the video."""

    def __init__(self, name: str, file: SequenceFile, stride: int = 1) -> None:
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.name, self.file, self.stride = name, file, int(stride)

    @property
    def source(self) -> str:
        """``path#key`` of the file, for messages."""
        return self.file.where

    @property
    def dim(self) -> int:
        return self.file.dim

    @property
    def lengths(self) -> np.ndarray:
        """(N,) steps of each video of the file (in file order) after the stride."""
        return -(-self.file.lengths // self.stride)

    @property
    def max_length(self) -> int:
        return int(self.lengths.max())

    def __contains__(self, video: object) -> bool:
        return video in self.file

    def length(self, video: str) -> int:
        """The steps of ``video`` after the stride."""
        return int(self.lengths[self.file.row_of(video)])

    def read(self, videos: Sequence[str]) -> list[np.ndarray]:
        """The (T_i, d) float32 features of ``videos`` (in that order), strided; a video
        with NaN or Inf features is refused."""
        arrays = self.file.read([self.file.row_of(video) for video in videos])
        for video, array in zip(videos, arrays, strict=True):
            if not np.isfinite(array).all():
                raise ValueError(f"{self.source}: video {video!r} has NaN or Inf features")
        return arrays if self.stride == 1 else [np.ascontiguousarray(a[:: self.stride]) for a in arrays]

    def chunks(self, videos: Sequence[str], max_bytes: int = CHUNK_BYTES) -> Iterator[list[str]]:
        """``videos`` in consecutive groups read in at most ``max_bytes`` (or one video)."""
        group: list[str] = []
        size = 0
        for video in videos:
            steps = int(self.file.lengths[self.file.row_of(video)])
            if group and size + steps * self.dim * 4 > max_bytes:
                yield group
                group, size = [], 0
            group.append(video)
            size += steps * self.dim * 4
        if group:
            yield group

    def check_values(self) -> None:
        """Read every video once, a chunk at a time, refusing NaN and Inf."""
        for group in self.chunks(self.file.ids):
            self.read(group)

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        """``{video id: (T, d) array}``, each read when asked for."""
        return _Arrays(self)


class _Arrays(Mapping[str, np.ndarray]):
    def __init__(self, features: VideoFeatures) -> None:
        self.features = features

    def __getitem__(self, video: str) -> np.ndarray:
        if video not in self.features:
            raise KeyError(video)
        return self.features.read([video])[0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.features.file.ids)

    def __len__(self) -> int:
        return len(self.features.file.ids)


def _split_spec(spec: str | Path, base: str | Path | None) -> tuple[Path, str | None]:
    text = str(spec)
    path_text, _, key = text.partition("#")
    path = Path(path_text).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    if not path.is_file():
        raise FileNotFoundError(f"feature file not found: {path}")
    return path, key or None


def open_video_features(spec: str | Path, name: str | None = None, *, base: str | Path | None = None,
                        stride: int = 1) -> VideoFeatures:
    """One modality's features from ``PATH`` or ``PATH#KEY`` (see the module docstring),
    the metadata checked, nothing read: values are read (and NaN refused) per batch.

    Args:
        spec: the file (relative paths are taken from ``base``), ``#KEY`` a group or array.
        name: the modality name (default: KEY, else the file stem).
        stride: keep every ``stride``-th step (a temporal subsample).
    """
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    path, key = _split_spec(spec, base)
    return VideoFeatures(name or key or path.stem, open_sequences(path, key), stride)


def load_video_features(spec: str | Path, name: str | None = None, *, base: str | Path | None = None,
                        stride: int = 1) -> VideoFeatures:
    """As :func:`open_video_features`, every value read once (a chunk at a time) and a
    video with NaN or Inf features refused up front."""
    features = open_video_features(spec, name, base=base, stride=stride)
    features.check_values()
    return features


# ---------------------------------------------------------------------------
# Captions and splits
# ---------------------------------------------------------------------------


def load_captions(path: str | Path) -> dict[str, list[str]]:
    """``{video_id: [caption, ...]}`` from JSON or CSV (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"caption file not found: {path}")
    pairs: list[tuple[str, object]] = []
    if path.suffix.lower() == ".csv":
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                if not reader.fieldnames or not {"video_id", "caption"} <= set(reader.fieldnames):
                    raise ValueError(
                        f"{path}: a caption CSV needs the columns video_id and caption, has {reader.fieldnames}")
                pairs = [(row["video_id"], row["caption"]) for row in reader]
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text (at byte offset {error.start} of a line); save it as UTF-8") from None
    else:
        content = read_json(path)
        if isinstance(content, Mapping) and "sentences" in content:  # MSR-VTT videodatainfo
            where = f"{path}: sentences"
            pairs = [(entry_field(item, "video_id", where, i, (str, int)), entry_field(item, "caption", where, i, str))
                     for i, item in enumerate(json_list(content, path, "sentences"))]
        elif isinstance(content, Mapping):
            for video, captions in content.items():
                if not isinstance(captions, list):
                    raise ValueError(f"{path}: video {video!r} maps to {type(captions).__name__}, not a list of captions")
                pairs += [(video, c) for c in captions]
        elif isinstance(content, list):
            for i, item in enumerate(content):
                key = "id" if isinstance(item, Mapping) and "id" in item else "video_id"
                video = str(entry_field(item, key, path, i, (str, int))).removesuffix(".avi")
                captions = entry_field(item, "caption", path, i, (str, list))
                pairs += [(video, c) for c in (captions if isinstance(captions, list) else [captions])]
        else:
            raise ValueError(f"{path}: expected a JSON object or list of captions, found a {type(content).__name__}")
    result: dict[str, list[str]] = {}
    for video, caption in pairs:
        if not isinstance(caption, str) or not ptb_tokenize(caption):
            raise ValueError(f"{path}: video {video!r} has an empty caption ({caption!r})")
        result.setdefault(str(video), []).append(caption)
    if not result:
        raise ValueError(f"{path}: no captions")
    return result


def load_splits(path: str | Path) -> dict[str, list[str]]:
    """``{"train", "val", "test"}`` -> video ids, from JSON (``valid`` and ``validation`` are read as ``val``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"split file not found: {path}")
    content = read_json(path)
    if not isinstance(content, Mapping):
        raise ValueError(f"{path}: expected a JSON object of split lists, found a {type(content).__name__}")
    splits = {}
    for name, aliases in (("train", ("train",)), ("val", ("val", "valid", "validation")), ("test", ("test",))):
        found = next((content[a] for a in aliases if a in content), None)
        if not isinstance(found, list):
            raise ValueError(f"{path}: no {name!r} list of video ids (keys: {', '.join(content)})")
        splits[name] = [str(v) for v in found]
    seen: dict[str, str] = {}
    for name, ids in splits.items():
        for video in ids:
            if video in seen:
                raise ValueError(f"{path}: video {video!r} is in both {seen[video]!r} and {name!r}")
            seen[video] = name
    return splits


# ---------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------


class Vocabulary:
    """Words of the training captions seen at least ``min_count`` times, and the specials.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then the words sorted.
    """

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(words)
        if self.words[:4] != [PAD, BEGIN, END, UNKNOWN]:
            raise ValueError(f"a vocabulary starts with {PAD}, {BEGIN}, {END}, {UNKNOWN}")
        self.index = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> Vocabulary:
        if min_count < 1:
            raise ValueError(f"vocabulary: min_count must be >= 1, got {min_count}")
        counts = Counter(word for caption in captions for word in ptb_tokenize(caption))
        return cls([PAD, BEGIN, END, UNKNOWN, *sorted(w for w, c in counts.items() if c >= min_count)])

    def __len__(self) -> int:
        return len(self.words)

    @property
    def pad(self) -> int:
        return 0

    @property
    def begin(self) -> int:
        return 1

    @property
    def end(self) -> int:
        return 2

    def encode(self, caption: str, max_words: int) -> list[int]:
        """``<bos> w_1 .. w_n <eos>`` ids (n <= max_words; unknown words -> ``<unk>``)."""
        unknown = self.index[UNKNOWN]
        return [1, *(self.index.get(w, unknown) for w in ptb_tokenize(caption)[:max_words]), 2]

    def decode(self, ids: Iterable[int]) -> str:
        """Words up to the end token (padding and begin tokens skipped)."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end:
                break
            if i > self.end:
                words.append(self.words[i])
        return " ".join(words)
