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

Captions: JSON ``{video_id: [caption, ...]}``; JSON ``[{"id": ..., "caption": [...]}]``
(the course MSVD files); MSR-VTT's ``{"sentences": [{"video_id", "caption"}]}``; or
CSV with the columns ``video_id`` and ``caption`` (one line per caption).
Splits: JSON ``{"train": [ids], "val": [ids], "test": [ids]}`` (``valid`` works too).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyfuse.data.arrays import NpzArrays, open_h5
from polyfuse.data.formats.jsonfile import entry_field, json_list, read_json
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
]

PAD, BEGIN, END, UNKNOWN = "<pad>", "<bos>", "<eos>", "<unk>"

# ---------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------


@dataclass
class VideoFeatures:
    """One modality: a (T, d) float32 array per video id."""

    name: str
    arrays: dict[str, np.ndarray]
    source: str

    @property
    def dim(self) -> int:
        return next(iter(self.arrays.values())).shape[1]

    @property
    def max_length(self) -> int:
        return max(a.shape[0] for a in self.arrays.values())


def _split_spec(spec: str | Path, base: str | Path | None) -> tuple[Path, str | None]:
    text = str(spec)
    path_text, _, key = text.partition("#")
    path = Path(path_text).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    if not path.is_file():
        raise FileNotFoundError(f"feature file not found: {path}")
    return path, key or None


def _from_id_arrays(ids: np.ndarray, values: np.ndarray, lengths: np.ndarray | None, where: str) -> dict[str, np.ndarray]:
    if values.ndim != 3:
        raise ValueError(f"{where}: expected an (N, T, d) array beside video_ids, got shape {values.shape}")
    if len(ids) != len(values):
        raise ValueError(f"{where}: video_ids has {len(ids)} entries but the features have {len(values)} rows")
    if lengths is not None:
        lengths = np.asarray(lengths)
        if lengths.shape != (len(ids),):
            raise ValueError(f"{where}: lengths has shape {lengths.shape}, expected ({len(ids)},)")
        bad = [(str(i), int(n)) for i, n in zip(ids, lengths, strict=True) if not 1 <= n <= values.shape[1]]
        if bad:
            raise ValueError(
                f"{where}: lengths disagree with the features (T = {values.shape[1]}) for video "
                f"{bad[0][0]!r} (length {bad[0][1]}; {len(bad)} such videos)"
            )
    out = {}
    for row, video in enumerate(ids):
        steps = values.shape[1] if lengths is None else int(lengths[row])
        out[str(video)] = np.asarray(values[row, :steps], dtype=np.float32)
    return out


def _check_arrays(arrays: Mapping[str, np.ndarray], where: str) -> None:
    if not arrays:
        raise ValueError(f"{where}: no video features found")
    dims = {}
    for video, array in arrays.items():
        if array.ndim != 2 or array.shape[0] < 1:
            raise ValueError(f"{where}: video {video!r} has features of shape {array.shape}; expected (T >= 1, d)")
        dims.setdefault(array.shape[1], video)
        if not np.isfinite(array).all():
            raise ValueError(f"{where}: video {video!r} has NaN or Inf features")
    if len(dims) > 1:
        (d1, v1), (d2, v2) = list(dims.items())[:2]
        raise ValueError(f"{where}: feature sizes disagree: video {v1!r} has d = {d1}, video {v2!r} has d = {d2}")


def load_video_features(spec: str | Path, name: str | None = None, *, base: str | Path | None = None,
                        stride: int = 1) -> VideoFeatures:
    """One modality's features from ``PATH`` or ``PATH#KEY`` (see the module docstring).

    Args:
        spec: the file (relative paths are taken from ``base``), ``#KEY`` a group or array.
        name: the modality name (default: KEY, else the file stem).
        stride: keep every ``stride``-th step (a temporal subsample).
    """
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    path, key = _split_spec(spec, base)
    where = f"{path}{'#' + key if key else ''}"
    suffix = path.suffix.lower()
    if suffix == ".npz":
        archive = NpzArrays(path)  # each array's size checked from its header before it is read
        names = list(archive)
        if "video_ids" in names:
            value_key = key or next((n for n in names if n not in ("video_ids", "lengths")), None)
            if value_key not in names:
                raise ValueError(f"{path}: no array {value_key!r}; it has {', '.join(names)}")
            lengths = archive["lengths"] if "lengths" in names else None
            arrays = _from_id_arrays(archive["video_ids"], archive[value_key], lengths, where)
        else:
            if key:
                raise ValueError(f"{path}: '#{key}' names an array, but this npz is keyed by video id")
            arrays = {video: np.asarray(archive[video], dtype=np.float32) for video in names}
    elif suffix in (".h5", ".hdf5"):
        import h5py

        with open_h5(path) as handle:  # no external storage or links, sizes bounded
            group = handle
            if key:
                if key not in handle:
                    raise ValueError(f"{path}: no group or array {key!r}; it has {', '.join(handle.keys())}")
                group = handle[key]
            if isinstance(group, h5py.Dataset) or "video_ids" in group:
                ids_node = handle["video_ids"] if isinstance(group, h5py.Dataset) else group["video_ids"]
                values = group[()] if isinstance(group, h5py.Dataset) else group[next(n for n in group if n not in ("video_ids", "lengths"))][()]
                ids = np.array([i.decode() if isinstance(i, bytes) else str(i) for i in ids_node[()]])
                lengths_node = group.get("lengths") if isinstance(group, h5py.Group) else handle.get("lengths")
                arrays = _from_id_arrays(ids, values, None if lengths_node is None else lengths_node[()], where)
            else:
                arrays = {
                    str(video): np.asarray(node[()], dtype=np.float32)
                    for video, node in group.items() if isinstance(node, h5py.Dataset)
                }
    else:
        raise ValueError(f"{path}: unsupported feature file type {suffix!r} (use .npz, .h5 or .hdf5)")
    _check_arrays(arrays, where)
    if stride > 1:
        arrays = {video: array[::stride] for video, array in arrays.items()}
    return VideoFeatures(name or key or path.stem, arrays, where)


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
