"""The word-aligned layout of the MFN line of work (CMU Multimodal SDK features).

A directory ``new_data/<dataset>/`` holds one HDF5 file per modality and split::

    text_train.h5  audio_train.h5  video_train.h5  y_train.h5
    text_valid.h5  ...                              y_valid.h5
    text_test.h5   ...                              y_test.h5

each with one dataset (MFN names it ``d1``): modalities (N, T, d) word-aligned
sequences, ``y`` (N,) or (N, k). Sequences are zero-padded; the CMU / MFN
convention pads on the left (zeros first, real steps last). The importer finds
each sample's real steps from the zero padding, moves them to the front (the
layout the rest of polyfuse reads) and writes ``<modality>_lengths``; a sample
whose modality is all zeros gets length 0: a missing modality, which the
backbones of :mod:`polyfuse.nn.backbones` mask out.

Arrays of the returned table: the modalities, their lengths, ``label`` (the ``y``
files), ``split`` (train / valid / test) and ``sample_index`` (the row within its split).

Shapes: ``N`` samples of a split, ``T`` steps, ``d`` features, ``k`` targets.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from polyfuse.data.arrays import ArrayTable, H5Arrays

__all__ = [
    "PADDINGS",
    "SPLITS",
    "WORD_ALIGNED_DATASETS",
    "is_word_aligned",
    "load_word_aligned",
    "move_real_steps_to_front",
    "present_modalities",
    "zero_padding_real_steps",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")  # the release's file suffixes (a "valid" row is split val)
PADDINGS = ("auto", "left", "right")
MODALITIES = ("text", "audio", "video")

# POM's traits (Park et al. 2014) and the scales they were rated on, as the MAN paper's
# Table 2 scores them: MA7 (a 1-7 scale) for confident, passionate, voice pleasant,
# dominant, credible, vivid, expertise, entertaining and persuasive; MA5 (1-5) for
# reserved, trusting, relaxed, outgoing, thorough, nervous and humorous. Keys are
# trait names as written by :func:`polyfuse.data.prepare.trait_key` (lower case, ``_``
# for spaces), with the paper's three-letter abbreviations as aliases.
_POM_SCALES = {
    (1.0, 7.0): ("confident con", "passionate pas", "voice_pleasant voice voi", "dominant dom", "credible cre",
                 "vivid viv", "expertise exp", "entertaining ent", "persuasive persuasiveness per"),
    (1.0, 5.0): ("reserved res", "trusting tru", "relaxed rel", "outgoing out", "thorough tho", "nervous ner",
                 "humorous hum"),
}
POM_TRAIT_RANGES: dict[str, tuple[float, float]] = {
    alias: scale for scale, traits in _POM_SCALES.items() for trait in traits for alias in trait.split()
}

# The documented label scales the directory name selects (MOSI: [-3, 3], Zadeh et al. 2016
# and the MAN paper, section 3.1; ICT-MMMO: 1-5 ratings; POM: per trait, above, looked up
# by task.target_names; YouTube: three classes, kept as stored): ``range`` is (low, high)
# for every target or a mapping from trait name to (low, high); the task that reads them
# and its metrics. Labels are checked against them by :func:`polyfuse.data.prepare.encode_labels`.
WORD_ALIGNED_DATASETS: dict[str, dict[str, object]] = {
    "mosi": {"range": (-3.0, 3.0), "task": "sentiment", "metrics": "MAE, Corr, Acc2, F1, Acc7"},
    "mmmo": {"range": (1.0, 5.0), "task": "sentiment", "metrics": "MAE, Corr, binary accuracy"},
    "youtube": {"range": None, "task": "classification", "metrics": "3-class accuracy, macro F1"},  # classes as stored
    "pom": {"range": POM_TRAIT_RANGES, "task": "traits", "metrics": "per-trait MAE, Pearson r, MA5 / MA7"},
}


def is_word_aligned(path: str | Path) -> bool:
    """True for a directory holding ``y_train.h5`` (the layout of this module)."""
    path = Path(path)
    return path.is_dir() and (path / "y_train.h5").is_file()


def present_modalities(directory: str | Path) -> list[str]:
    """The modalities of a word-aligned directory: every ``<name>_train.h5`` but
    ``y_train.h5`` (text, audio, video first, then the others by name)."""
    names = {path.name[: -len("_train.h5")] for path in Path(directory).glob("*_train.h5")} - {"y"}
    return [m for m in MODALITIES if m in names] + sorted(names - set(MODALITIES))


def _read_single(path: Path) -> np.ndarray:
    """The one dataset of an MFN file (``d1``), read as :class:`~polyfuse.data.arrays.H5Arrays`
    reads any HDF5 file: bounded in size, no external storage, links or virtual datasets."""
    if not path.is_file():
        raise FileNotFoundError(f"word-aligned data: {path} is missing")
    arrays = H5Arrays(path)
    names = ["d1"] if "d1" in arrays else list(arrays)
    if len(names) != 1:
        raise ValueError(f"{path}: expected one dataset (MFN's 'd1'), found {names or 'none'}")
    return arrays[names[0]]


def zero_padding_real_steps(array: np.ndarray) -> np.ndarray:
    """(N, T) bool: steps that are not all zero."""
    return np.any(array != 0, axis=-1)


def _detect_padding(real: np.ndarray, origin: str) -> str:
    """``left`` if every sample's real steps end at the last step, ``right`` if they
    start at the first; refuses a file that fits neither."""
    steps = real.shape[1]
    lengths = real.sum(axis=1)
    index = np.arange(steps)
    left = np.array_equal(real, index[None, :] >= steps - lengths[:, None])
    right = np.array_equal(real, index[None, :] < lengths[:, None])
    if left and not right:
        return "left"
    if right and not left:
        return "right"
    if left and right:  # every sample full or empty: either reading is the same
        return "right"
    raise ValueError(
        f"{origin}: the zero padding is neither all at the start nor all at the end of the "
        "sequences; set data.padding (left or right) to say which steps are real"
    )


def move_real_steps_to_front(array: np.ndarray, real: np.ndarray, padding: str) -> tuple[np.ndarray, np.ndarray]:
    """Real steps first: (N, T, d) and (N,) lengths (steps up to the last real one for
    right padding, from the first real one for left padding; zero rows inside stay)."""
    steps = array.shape[1]
    index = np.arange(steps)
    if padding == "right":
        lengths = np.where(real.any(axis=1), steps - np.argmax(real[:, ::-1], axis=1), 0)
        return array, lengths.astype(np.int64)
    first = np.where(real.any(axis=1), np.argmax(real, axis=1), steps)
    lengths = (steps - first).astype(np.int64)
    source = (index[None, :] + first[:, None]) % steps  # roll each row left by its padding
    moved = np.take_along_axis(array, source[:, :, None], axis=1)
    moved = np.where((index[None, :] < lengths[:, None])[:, :, None], moved, 0)
    return moved.astype(array.dtype, copy=False), lengths


def load_word_aligned(
    directory: str | Path,
    *,
    modalities: Sequence[str] | None = None,
    padding: str = "auto",
    label_range: Sequence[float] | Sequence[Sequence[float]] | None = None,
    dataset: str | None = None,
) -> ArrayTable:
    """Read the word-aligned layout of ``directory`` (see the module docstring).

    Args:
        directory: the folder with ``{modality}_{split}.h5`` and ``y_{split}.h5``.
        modalities: which modalities to read, any subset of those present (default:
            all present, see :func:`present_modalities`).
        padding: ``left`` (CMU / MFN: zeros first), ``right``, or ``auto`` (detected
            per file and logged; a file that fits neither is refused).
        label_range: (low, high), one pair per target, or a mapping from trait name
            to (low, high): the documented scale, recorded on the table; the labels
            are checked against it (or clipped on request) when the data is prepared,
            each refused label named by its file and row. Default: the scale of
            ``dataset`` (``mosi``, ``mmmo``, ``youtube``, ``pom``; default: the
            directory's name, see :data:`WORD_ALIGNED_DATASETS`) when known, else none.
        dataset: the dataset name for ``label_range``.
    """
    directory = Path(directory)
    if padding not in PADDINGS:
        raise ValueError(f"data.padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
    if not is_word_aligned(directory):
        raise FileNotFoundError(f"{directory}: not a word-aligned data directory (no y_train.h5)")
    dataset = (dataset or directory.name).lower()
    if label_range is None and dataset in WORD_ALIGNED_DATASETS:
        label_range = WORD_ALIGNED_DATASETS[dataset]["range"]  # type: ignore[assignment]
    available = present_modalities(directory)
    if modalities is None:
        modalities = available
        if not modalities:
            raise FileNotFoundError(f"{directory}: no modality files (<modality>_train.h5 next to y_train.h5)")
    modalities = list(modalities)
    present = {m: [(directory / f"{m}_{s}.h5").is_file() for s in SPLITS] for m in modalities}
    for name, found in present.items():
        if any(found) and not all(found):
            have = [s for s, f in zip(SPLITS, found, strict=True) if f]
            lack = [s for s, f in zip(SPLITS, found, strict=True) if not f]
            raise ValueError(
                f"{directory}: modality {name!r} is present in split(s) {have} but missing in {lack} "
                f"({', '.join(f'{name}_{s}.h5' for s in lack)})"
            )
        if not any(found):
            raise FileNotFoundError(
                f"{directory}: no {name}_train.h5 / _valid.h5 / _test.h5 for modality {name!r}; "
                f"modalities present: {', '.join(available) or 'none'} (set data.modalities to a subset of them)"
            )
    arrays: dict[str, list[np.ndarray]] = {}
    labels, split, index = [], [], []
    for part in SPLITS:
        y_path = directory / f"y_{part}.h5"
        y = _read_single(y_path)
        _check_labels(y, y_path)
        count = y.shape[0]
        labels.append(y.astype(np.float32))
        split.append(np.full(count, part, dtype="U5"))
        index.append(np.arange(count))
        for name in modalities:
            path = directory / f"{name}_{part}.h5"
            array = _read_single(path)
            if array.ndim != 3 or array.shape[0] != count or array.dtype.kind not in "fiu":
                raise ValueError(
                    f"{path}: modality {name!r} has shape {array.shape} ({array.dtype}); expected numbers of "
                    f"shape (N, T, d) with N = {count} (the rows of {y_path.name})"
                )
            if name in arrays and arrays[name][0].shape[1:] != array.shape[1:]:
                first = directory / f"{name}_train.h5"
                raise ValueError(
                    f"{path}: modality {name!r} has (T, d) = {array.shape[1:]}, but {first.name} has "
                    f"{arrays[name][0].shape[1:]}: the splits disagree"
                )
            array = np.nan_to_num(array.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
            real = zero_padding_real_steps(array)
            used = _detect_padding(real, str(path)) if padding == "auto" else padding
            if padding == "auto":
                log.info("%s: %s padding detected", path, used)
            moved, lengths = move_real_steps_to_front(array, real, used)
            arrays.setdefault(name, []).append(moved)
            arrays.setdefault(f"{name}_lengths", []).append(lengths)
    label_shapes = {y.shape[1:] for y in labels}
    if len(label_shapes) > 1:
        raise ValueError(f"{directory}: y_train/valid/test.h5 disagree in the number of targets: {sorted(label_shapes)}")
    table = {name: np.concatenate(parts) for name, parts in arrays.items()}
    table["label"] = np.concatenate(labels)
    table["split"] = np.concatenate(split)
    table["sample_index"] = np.concatenate(index)
    split_of, row_of = table["split"], table["sample_index"]

    def row_origin(row: int) -> str:
        return f"{directory / f'y_{split_of[row]}.h5'} row {int(row_of[row])}"

    return ArrayTable(
        str(directory), table, label_range=label_range, modalities=tuple(modalities),
        row_origin=row_origin, dataset=dataset, padding_applied=True,
    )


def _check_labels(y: np.ndarray, path: Path) -> None:
    if y.dtype.kind not in "fiub" or y.ndim not in (1, 2):
        raise ValueError(f"{path}: labels have shape {y.shape} ({y.dtype}); expected numbers of shape (N,) or (N, k)")
    if not np.isfinite(y).all():
        raise ValueError(f"{path}: labels hold NaN or Inf (row {int(np.argwhere(~np.isfinite(y))[0][0])})")
