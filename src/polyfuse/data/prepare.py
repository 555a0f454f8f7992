"""From named arrays to model-ready data: modalities, labels, splits, windows.

:func:`prepare_data` applies the ``data`` section of a configuration to an
:class:`~polyfuse.data.arrays.ArrayTable`: it picks the modalities, checks every
shape, handles non-finite values, encodes the labels for the task, resolves the
train / valid / test splits, standardises with training statistics and, in
contextual mode, builds the windows.

The features are not held in memory: each modality is a :class:`Features` that reads a
batch of rows (``.npz``: a memory map of the file, ``.h5``: rows of the dataset; other
sources: their arrays in memory) and applies the preparation to them. One pass over the
rows, a block at a time (:data:`BLOCK_BYTES`), finds the lengths of zero-padded rows,
refuses (or imputes) non-finite values, and computes the training statistics: over one
array as :func:`~polyfuse.data.standardize.fit_stats` always has when the training rows
take at most :data:`EXACT_STATS_BYTES` (so that earlier results are reproduced to the
bit), streamed in float64 above. Memory does not grow with the number of rows beyond
one value per row (lengths, labels, splits).

Shapes: ``N`` rows, ``T_j`` steps and ``d_j`` features of modality j, ``k`` targets,
``W`` window length.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.data.arrays import ArrayTable, H5Arrays, NpzArrays
from polyfuse.data.context import context_windows
from polyfuse.data.formats.word_aligned import move_real_steps_to_front, zero_padding_real_steps
from polyfuse.data.rows import H5File, npz_member
from polyfuse.data.splits import resolve_splits
from polyfuse.data.standardize import FeatureStats, StreamingStats, fit_stats, real_steps

__all__ = [
    "EXACT_STATS_BYTES", "LABEL_KINDS", "OUT_OF_RANGE_POLICIES", "Features", "Split", "TabularData", "encode_labels",
    "prepare_data", "trait_key",
]

log = logging.getLogger(__name__)

#: How labels are encoded: one score per row (task.type sentiment), several scores per row
#: (traits), one class per row (classification). A task spec names its kind.
LABEL_KINDS = ("score", "scores", "class")
NONFINITE_POLICIES = ("error", "zero", "mean")
OUT_OF_RANGE_POLICIES = ("error", "clip")


@dataclass
class Split:
    """The samples of one split.

    rows: (n,) the row of each sample (its label is the target).
    windows: (n, W) row indices with -1 for padding (contextual mode), else None.
    centre: (n,) position of the sample's own row in its window, else None.
    """

    rows: np.ndarray
    windows: np.ndarray | None = None
    centre: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.rows.size)


@dataclass
class TabularData:
    """Standardised features, encoded targets and splits (see the module docstring).

    features[j]: :class:`Features` (N, T_j, d_j) float32 (contextual mode: T_j = 1),
    padded steps 0, read a batch of rows at a time (``features[j].rows(rows)``).
    lengths[j]: (N,) int64 real steps. targets: (N,) float32 (sentiment), (N, k)
    float32 (traits), (N,) int64 class indices (classification), or None without
    labels. stats: the training statistics per modality (applied when
    ``data.standardize`` is on; the means also fill imputed values).
    """

    origin: str
    modalities: list[str]
    features: list[Features]
    lengths: list[np.ndarray]
    targets: np.ndarray | None
    splits: dict[str, Split]
    stats: dict[str, FeatureStats]
    label_info: dict[str, Any] = field(default_factory=dict)
    ids: np.ndarray | None = None

    @property
    def input_dims(self) -> list[int]:
        return [int(x.shape[-1]) for x in self.features]

    @property
    def contextual(self) -> bool:
        return any(p.windows is not None for p in self.splits.values())


#: Training rows up to this many bytes (float32) are gathered into one array and their
#: statistics computed by :func:`~polyfuse.data.standardize.fit_stats` over it, exactly as
#: when whole arrays were prepared (the same numbers to the bit); larger ones are streamed
#: a block at a time in float64 (:class:`~polyfuse.data.standardize.StreamingStats`), the
#: same up to rounding. ``POLYFUSE_EXACT_STATS_BYTES`` sets it.
EXACT_STATS_BYTES = int(os.environ.get("POLYFUSE_EXACT_STATS_BYTES", str(256 << 20)))
#: the preparation pass reads rows in blocks of about this many bytes (float32)
BLOCK_BYTES = 64 << 20


class ArrayRows:
    """Rows of an array held in memory or memory-mapped: ``shape``, ``dtype``, ``read(rows)``."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.shape, self.dtype = array, array.shape, array.dtype

    def read(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.array[rows])


class NpzRows(ArrayRows):
    """Rows of an ``.npz`` array, memory-mapped when stored uncompressed
    (:func:`~polyfuse.data.rows.npz_member`); pickled as its path and name."""

    def __init__(self, path: str | Path, name: str) -> None:
        self.path, self.name = Path(path), name
        super().__init__(npz_member(self.path, name))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["name"])


class H5Rows:
    """Rows of a dataset of an HDF5 file (:class:`~polyfuse.data.rows.H5File`)."""

    def __init__(self, file: H5File, name: str) -> None:
        self.file, self.name, self.shape = file, name, file.shape(name)
        with file.opened() as handle:
            self.dtype = handle[name].dtype

    def read(self, rows: np.ndarray) -> np.ndarray:
        return self.file.read(self.name, rows)


def _rows_of(table: ArrayTable, name: str) -> ArrayRows | H5Rows:
    """Modality ``name`` read in rows: npz and HDF5 files from disk, other tables' arrays from memory."""
    if name not in table:
        table.get(name, "a modality")  # refused, naming the arrays there are
    if isinstance(table.arrays, NpzArrays):
        return NpzRows(table.arrays.path, name)
    if isinstance(table.arrays, H5Arrays):
        return H5Rows(H5File(table.arrays.path), name)
    return ArrayRows(np.asarray(table.arrays[name]))


class Features:
    """One modality as prepared, read a batch of rows at a time (see :meth:`rows`).

    ``shape`` is (N, T, d); ``lengths`` (N,) the real steps of each row. The settings
    (``used``, ``nonfinite``, ``stats``, ``standardize``) are set by :func:`prepare_data`.
    ``np.asarray(features)`` and indexing read the rows they need (all of them for
    anything but rows as the first index): for small data and tests.
    """

    def __init__(self, origin: str, name: str, source: ArrayRows | H5Rows, lengths: np.ndarray, padding: str) -> None:
        self.origin, self.name, self.source, self.lengths, self.padding = origin, name, source, lengths, padding
        count, *rest = source.shape
        self.shape: tuple[int, int, int] = (count, *rest) if len(rest) == 2 else (count, 1, *rest)  # type: ignore[assignment]
        self.used = np.ones(count, dtype=bool)
        self.nonfinite = "error"
        self.stats: FeatureStats | None = None
        self.standardize = True

    dtype = np.dtype(np.float32)
    ndim = 3

    def __len__(self) -> int:
        return self.shape[0]

    def clean(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows before standardisation: (B, T, d) float32 with real steps first, their (B,)
        lengths, and (B, T, d) bool where a real step of a used row is not finite."""
        raw = self.source.read(rows)
        if raw.ndim == 2:
            raw = raw[:, None, :]
        if self.padding == "auto":
            block, lengths = raw.astype(np.float32), self.lengths[rows]
        else:
            moved, lengths = move_real_steps_to_front(raw, zero_padding_real_steps(raw), self.padding)
            block = moved.astype(np.float32)
        bad = ~np.isfinite(block) & real_steps(lengths, self.shape[1])[:, :, None] & self.used[rows][:, None, None]
        return block, lengths, bad

    def impute(self, block: np.ndarray, bad: np.ndarray) -> None:
        """Impute the ``bad`` values of ``block`` in place (``nonfinite`` zero: 0; mean:
        NaN, filled with the training mean by :meth:`rows`)."""
        if self.nonfinite != "error" and bad.any():
            block[bad] = 0.0 if self.nonfinite == "zero" else np.nan

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """(B, T, d) float32: rows ``rows``, imputed, standardised (``data.standardize``),
        padded steps 0; a non-finite value is refused naming the file, array and row."""
        rows = np.asarray(rows, dtype=np.int64)
        block, lengths, bad = self.clean(rows)
        if self.nonfinite == "error" and bad.any():
            raise _nonfinite_error(self, _first_nonfinite(block, bad, rows), int(bad.sum()))
        self.impute(block, bad)
        assert self.stats is not None, "prepare_data sets the statistics"
        if self.standardize:
            block = self.stats.apply(block)
            fill = np.zeros(self.shape[-1], dtype=np.float32)
        else:
            fill = self.stats.mean
        block = np.where(np.isnan(block), fill, block)  # the 'mean' imputation
        return np.where(real_steps(lengths, self.shape[1])[:, :, None], block, 0.0).astype(np.float32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.rows(np.arange(self.shape[0]))
        return whole if dtype is None else whole.astype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(first, slice) or np.ndim(first) == 1 or isinstance(first, (int, np.integer)):
            picked = np.arange(self.shape[0])[first]
            if picked.ndim == 0:
                return self.rows(picked[None])[(0, *rest)]
            return self.rows(picked)[(slice(None), *rest)]
        return np.asarray(self)[key]


def _first_nonfinite(block: np.ndarray, bad: np.ndarray, rows: np.ndarray) -> tuple[int, int, int, str]:
    """Row, step, feature and kind (NaN / Inf) of the first ``bad`` value of ``block``."""
    index, step, feature = (int(v) for v in np.argwhere(bad)[0])
    return int(rows[index]), step, feature, "NaN" if np.isnan(block[index, step, feature]) else "Inf"


def _nonfinite_error(features: Features, first: tuple[int, int, int, str], count: int) -> ValueError:
    row, step, feature, kind = first
    more = f" (and {count - 1} more)" if count > 1 else ""
    return ValueError(
        f"{features.origin}: modality {features.name!r} has {kind} at row {row} (step {step}, feature {feature})"
        f"{more}; fix the file or set data.nonfinite to 'zero' or 'mean' to impute"
    )


def _modality(table: ArrayTable, name: str, padding: str = "auto") -> Features:
    """One modality, (N, T, d) (or (N, d), read as T = 1) read in rows, and its lengths.

    ``padding``: ``auto`` reads the generic layout (real steps first, lengths from
    ``<name>_lengths`` or all steps); ``left`` / ``right`` find each sample's real steps
    from its zero padding (zeros first / last) and move them to the front, as the
    word-aligned importer does (the lengths are found by :func:`_scan`); they exclude a
    lengths array."""
    source = _rows_of(table, name)
    shape = tuple(source.shape)
    if source.dtype.kind not in "fiub":
        raise ValueError(f"{table.origin}: modality {name!r} has dtype {source.dtype}, not numeric")
    if len(shape) == 2:
        shape = (shape[0], 1, shape[1])
    if len(shape) != 3 or 0 in shape:
        raise ValueError(
            f"{table.origin}: modality {name!r} has shape {tuple(source.shape)}; expected (N, T, d) or (N, d)"
        )
    length_name = f"{name}_lengths"
    if padding not in ("auto", "left", "right"):
        raise ValueError(f"data.padding must be one of auto, left, right, got {padding!r}")
    lengths = np.full(shape[0], shape[1], dtype=np.int64)
    if padding != "auto":
        if length_name in table:
            raise ValueError(
                f"{table.origin}: data.padding: {padding} and the array {length_name!r} both say which steps of "
                f"{name!r} are real; drop data.padding (lengths, real steps first) or the lengths array"
            )
    elif length_name in table:
        lengths = table.per_sample(length_name, f"lengths of {name!r}", shape[0])
        if lengths.dtype.kind not in "iu":
            raise ValueError(f"{table.origin}: {length_name!r} must hold integers, got {lengths.dtype}")
        bad = np.flatnonzero((lengths < 0) | (lengths > shape[1]))  # 0: a missing modality
        if bad.size:
            raise ValueError(
                f"{table.origin}: {length_name!r} is {int(lengths[bad[0]])} at row {int(bad[0])}; "
                f"every length must lie in [0, {shape[1]}] (T of {name!r}; 0: modality missing)"
            )
        lengths = lengths.astype(np.int64)
    return Features(table.origin, name, source, lengths, padding)


def _scan(features: Features, train_rows: np.ndarray, fit: bool) -> FeatureStats | None:
    """The one pass over every row of a modality, a block at a time: the lengths of
    zero-padded rows, the non-finite values of used rows (refused naming the first, or
    imputed and logged), and with ``fit`` the statistics of the training rows (over one
    array up to :data:`EXACT_STATS_BYTES`, else streamed)."""
    count, steps, size = features.shape
    is_train = np.zeros(count, dtype=bool)
    is_train[train_rows] = True
    exact = train_rows.size * steps * size * 4 <= EXACT_STATS_BYTES
    streamed = StreamingStats(size) if fit and not exact else None
    block_rows = max(1, BLOCK_BYTES // (steps * size * 4))
    found, bad_rows, first = 0, 0, None
    for start in range(0, count, block_rows):
        rows = np.arange(start, min(count, start + block_rows))
        block, lengths, bad = features.clean(rows)
        features.lengths[rows] = lengths  # found from the zero padding, or as they were
        if bad.any():
            first = first or _first_nonfinite(block, bad, rows)
            found, bad_rows = found + int(bad.sum()), bad_rows + int(bad.any(axis=(1, 2)).sum())
            features.impute(block, bad)
        if streamed is not None:
            streamed.add(block[is_train[rows]], lengths[is_train[rows]])
    if first is not None:
        if features.nonfinite == "error":
            raise _nonfinite_error(features, first, found)
        log.warning(
            "%s: imputing %d non-finite value(s) of modality %r in %d row(s) (first: row %d) with %s",
            features.origin, found, features.name, bad_rows, first[0],
            "0" if features.nonfinite == "zero" else "the training mean of the feature",
        )
    if not fit:
        return None
    if streamed is not None:
        return streamed.result()
    gathered = np.empty((train_rows.size, steps, size), dtype=np.float32)  # features[train_rows]
    for start in range(0, train_rows.size, block_rows):
        block, _, bad = features.clean(train_rows[start : start + block_rows])
        features.impute(block, bad)
        gathered[start : start + block_rows] = block
    return fit_stats(gathered, features.lengths[train_rows], np.arange(train_rows.size))


def trait_key(name: str) -> str:
    """A trait name as the documented scales are keyed: lower case, ``_`` for spaces and dashes."""
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def _documented_ranges(documented: Any, names: Sequence[str], origin: str) -> list[list[float] | None]:
    """One documented (low, high) per target, None where the format documents none:
    ``documented`` is (low, high) for every target, one pair per target, or a mapping
    from trait name to (low, high) (POM), looked up by ``names``."""
    k = len(names)
    if documented is None:
        return [None] * k
    if isinstance(documented, Mapping):
        found = [documented.get(trait_key(name)) for name in names]
        return [None if pair is None else [float(pair[0]), float(pair[1])] for pair in found]
    pairs = np.asarray(documented, dtype=np.float64)
    if pairs.ndim == 1:
        pairs = np.broadcast_to(pairs, (k, 2))
    if pairs.shape != (k, 2):
        raise ValueError(f"{origin}: {k} targets but {pairs.shape[0]} documented label ranges")
    return pairs.tolist()


def _configured_ranges(configured: Any, names: Sequence[str], origin: str) -> list[list[float] | None]:
    """``task.target_ranges``: one [low, high] per label column, or a mapping from target
    name to [low, high] (targets it does not name: None)."""
    k = len(names)
    if configured is None:
        return [None] * k
    if isinstance(configured, Mapping):
        unknown = [name for name in configured if name not in names]
        if unknown:
            raise ValueError(f"task.target_ranges names {unknown[0]!r}, not one of the target names {list(names)}")
        return [None if name not in configured else [float(v) for v in configured[name]] for name in names]
    if len(configured) != k:
        raise ValueError(f"{origin}: {k} label columns but {len(configured)} task.target_ranges")
    return [[float(low), float(high)] for low, high in configured]


def _apply_ranges(
    labels: np.ndarray, ranges: Sequence[Sequence[float] | None], sources: Sequence[str | None],
    names: Sequence[str], policy: str, where: Callable[[int], str],
) -> np.ndarray:
    """Refuse (``error``) or clip (``clip``, logged) labels outside their range; (N, k) labels.

    Columns whose range is None (taken from the training labels) are not checked."""
    if policy not in OUT_OF_RANGE_POLICIES:
        raise ValueError(f"task.out_of_range must be one of {', '.join(OUT_OF_RANGE_POLICIES)}, got {policy!r}")
    clipped = labels
    for column, (pair, source) in enumerate(zip(ranges, sources, strict=True)):
        if pair is None or source is None:
            continue
        low, high = pair
        values = labels[:, column]
        outside = np.flatnonzero(np.isfinite(values) & ((values < low) | (values > high)))
        if not outside.size:
            continue
        row = int(outside[0])
        value = f"{names[column]} = {float(values[row]):g}"
        if policy == "error":
            more = f" (and {outside.size - 1} more)" if outside.size > 1 else ""
            raise ValueError(
                f"{where(row)}: label {value} lies outside its range [{low:g}, {high:g}] ({source}){more}; "
                "fix the file, set task.target_ranges, or task.out_of_range: clip"
            )
        if clipped is labels:
            clipped = labels.copy()
        clipped[:, column] = np.clip(values, low, high)
        log.warning(
            "%s: clipped %d label(s) of %s into its range [%g, %g] (%s; task.out_of_range: clip), first at %s (%s)",
            where(row).rsplit(" row ", 1)[0], outside.size, names[column], low, high, source, where(row), value,
        )
    return clipped


def encode_labels(
    raw: np.ndarray,
    label_kind: str,
    train_rows: np.ndarray,
    task: Mapping[str, Any],
    *,
    origin: str,
    label_info: Mapping[str, Any] | None = None,
    documented_range: Any = None,
    where: Callable[[int], str] | None = None,
    dataset: str | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Targets for the task and what is needed to decode them.

    ``label_kind`` (:data:`LABEL_KINDS`): score (task.type sentiment): (N,) float32; a range (``task.target_ranges`` with one pair, else
    ``documented_range``) is recorded as ``range`` and checked. traits: (N, k) float32,
    with target names and integer ranges per target: ``task.target_ranges`` (one pair
    per label column, or a mapping from target name to pair), else
    ``documented_range`` (the scale a data format documents: (low, high) for every
    target, one pair per target, or a mapping from trait name to pair, looked up by
    ``task.target_names``), else the training labels' floor-min and ceil-max, which is
    logged as a warning (a 1-7 trait whose training maximum is 6 would become MA6) and
    not checked. Labels outside a configured or documented range are refused, naming
    their file and row (``where(row)``), or clipped into it with a warning when
    ``task.out_of_range`` is ``clip``. ``task.targets`` keeps some of the label columns
    only (names of ``task.target_names``, or column indices): one trait on request.
    class (task.type classification): (N,) int64 class indices into the sorted class values of the
    training rows. ``label_info`` (from a checkpoint) fixes names, ranges, columns
    and classes.
    """
    if label_kind not in LABEL_KINDS:
        raise ValueError(f"unknown label kind {label_kind!r}; expected one of {', '.join(LABEL_KINDS)}")
    task_type = task.get("type", label_kind)  # named in messages
    where = where or (lambda row: f"{origin} row {row}")
    policy = task.get("out_of_range", "error")
    documented_source = f"the documented scale of {dataset}" if dataset else "the documented scale of the data"
    if label_kind == "class":
        values = raw.astype(str) if raw.dtype.kind in "US" else raw
        if values.ndim != 1:
            raise ValueError(f"{origin}: classification labels must have shape (N,), got {raw.shape}")
        if values.dtype.kind == "f":  # NaN is a missing label, never a class
            missing = ~np.isfinite(values)
            if bool(missing[train_rows].any()):
                row = int(train_rows[np.flatnonzero(missing[train_rows])[0]])
                raise ValueError(f"{origin}: the label of row {row} is not finite (NaN / Inf); it cannot be a class")
        classes = list(label_info["classes"]) if label_info else np.unique(values[train_rows]).tolist()
        lookup = {value: index for index, value in enumerate(classes)}
        encoded = np.full(values.shape[0], -1, dtype=np.int64)
        for index, value in enumerate(values.tolist()):
            encoded[index] = lookup.get(value, -1)
        return encoded, {"classes": classes}
    if raw.dtype.kind not in "fiub":
        raise ValueError(f"{origin}: labels have dtype {raw.dtype}; a {task_type} task needs numbers")
    labels = raw.astype(np.float32)
    if label_kind == "score":
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise ValueError(
                f"{origin}: sentiment labels must have shape (N,), got {raw.shape}; "
                "use task.type: traits for several targets"
            )
        if label_info and label_info.get("range"):
            pair, source = list(label_info["range"]), "the checkpoint's range"
        elif task.get("target_ranges") is not None:
            configured = task["target_ranges"]
            if isinstance(configured, Mapping) or len(configured) != 1:
                raise ValueError("task.target_ranges: a sentiment task takes one [low, high] pair")
            pair, source = [float(v) for v in configured[0]], "task.target_ranges"
        else:
            pair = _documented_ranges(documented_range, ["label"], origin)[0] if documented_range is not None else None
            source = documented_source
        if pair is None:
            return labels, {}
        labels = _apply_ranges(labels[:, None], [pair], [source], ["label"], policy, where)[:, 0]
        return labels, {"range": pair}
    if labels.ndim == 1:
        labels = labels[:, None]
    if labels.ndim != 2:
        raise ValueError(f"{origin}: trait labels must have shape (N, k), got {raw.shape}")
    if label_info:
        columns = list(label_info.get("columns", range(labels.shape[1])))
        if max(columns) >= labels.shape[1]:
            raise ValueError(f"{origin}: the checkpoint reads label column {max(columns)}, the labels have {labels.shape[1]}")
        info = {"names": list(label_info["names"]), "ranges": [list(r) for r in label_info["ranges"]], "columns": columns}
        checked = list(label_info["checked"])
        info["checked"] = checked
        sources = ["the checkpoint's range" if c else None for c in checked]
        return _apply_ranges(labels[:, columns], info["ranges"], sources, info["names"], policy, where), info
    k = labels.shape[1]
    names = list(task.get("target_names") or [f"t{i}" for i in range(k)])
    if len(names) != k:
        raise ValueError(f"{origin}: {k} trait targets but {len(names)} target_names")
    configured = _configured_ranges(task.get("target_ranges"), names, origin)
    documented = _documented_ranges(documented_range, names, origin)
    ranges: list[list[float]] = []
    sources: list[str | None] = []
    guessed = []
    train = labels[train_rows]
    for i in range(k):
        if configured[i] is not None:
            ranges.append(configured[i])
            sources.append("task.target_ranges")
        elif documented[i] is not None:
            ranges.append(documented[i])
            sources.append(documented_source)
        else:
            ranges.append([float(np.floor(np.nanmin(train[:, i]))), float(np.ceil(np.nanmax(train[:, i])))])
            sources.append(None)
            guessed.append(i)
    for name, (low, high), source in zip(names, ranges, sources, strict=True):
        if not (np.isfinite(low) and np.isfinite(high) and round(high) - round(low) >= 1):
            raise ValueError(
                f"{origin}: the range of target {name!r} is [{low:g}, {high:g}] ({source or 'the training labels'}); "
                "MA-k needs at least 2 integer classes: set task.target_ranges"
            )
    if guessed:
        hint = ""
        if isinstance(documented_range, Mapping):
            hint = f" ({dataset or 'the data set'} documents scales for the traits named {sorted(set(documented_range))[:6]}...)"
        log.warning(
            "%s: trait ranges taken from the training labels (%s); the multi-class accuracy needs the "
            "documented scale: set task.target_ranges%s", origin,
            ", ".join(f"{names[i]} {ranges[i]}" for i in guessed), hint,
        )
    labels = _apply_ranges(labels, ranges, sources, names, policy, where)
    columns = list(range(k))
    if task.get("targets"):
        columns = []
        for wanted in task["targets"]:
            if isinstance(wanted, int) and not isinstance(wanted, bool):
                if not 0 <= wanted < k:
                    raise ValueError(f"{origin}: task.targets names column {wanted}; the labels have {k} (0 to {k - 1})")
                columns.append(wanted)
            elif wanted in names:
                columns.append(names.index(wanted))
            else:
                raise ValueError(f"{origin}: task.targets names {wanted!r}, not one of the target_names {names}")
        if len(set(columns)) != len(columns):
            raise ValueError(f"{origin}: task.targets names a target twice: {task['targets']}")
    return labels[:, columns], {
        "names": [names[c] for c in columns], "ranges": [ranges[c] for c in columns], "columns": columns,
        "checked": [sources[c] is not None for c in columns],
    }


def _check_labels(origin: str, targets: np.ndarray, rows: np.ndarray, label_kind: str, label_info: dict) -> None:
    used = targets[rows]
    if label_kind == "class":
        bad = np.flatnonzero(used < 0)
        if bad.size:
            raise ValueError(
                f"{origin}: row {int(rows[bad[0]])} has no label (NaN) or a class that the training rows "
                f"do not have (classes: {label_info['classes'][:20]})"
            )
        return
    finite = np.isfinite(used).all(axis=tuple(range(1, used.ndim)))  # per row (N = 0 too)
    if not finite.all():
        row = int(rows[np.flatnonzero(~finite)[0]])
        raise ValueError(f"{origin}: the label of row {row} is not finite")


def prepare_data(
    table: ArrayTable,
    data: Mapping[str, Any],
    task: Mapping[str, Any],
    *,
    label_kind: str,
    stats: Mapping[str, FeatureStats] | None = None,
    label_info: Mapping[str, Any] | None = None,
    splits: Sequence[str] | None = None,
    require_labels: bool = True,
) -> TabularData:
    """Apply the ``data`` section of a configuration to ``table``.

    Args:
        table: the arrays of the data source.
        data: the ``data`` configuration (see docs/TRAINING.md).
        task: the ``task`` configuration (``type`` and, for traits, names and ranges).
        label_kind: how labels are encoded (:data:`LABEL_KINDS`, the task spec's).
        stats: standardisation statistics to use (from a checkpoint) instead of
            fitting them on the training rows.
        label_info: label encoding to use (from a checkpoint).
        splits: which splits to build; None for train, val and test;
            ``["all"]`` for every row of the table as one split.
        require_labels: False to allow a table without the label array (prediction).
    """
    origin = table.origin
    names = data.get("modalities")
    if not names:
        raise ValueError(
            f"{origin}: name the modalities to use (data.modalities or --modalities); "
            f"arrays in the file: {', '.join(table.names())}"
        )
    names = [str(name) for name in names]
    if len(set(names)) != len(names):
        raise ValueError(f"data.modalities names a modality twice: {names}")
    padding = "auto" if table.padding_applied else data.get("padding", "auto")
    features = [_modality(table, name, padding) for name in names]
    count = features[0].shape[0]
    for name, array in zip(names, features, strict=True):
        if array.shape[0] != count:
            raise ValueError(
                f"{origin}: modality {name!r} has {array.shape[0]} rows, {names[0]!r} has {count}"
            )
    policy = data.get("nonfinite", "error")
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"data.nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, got {policy!r}")

    def per_sample(key: str | None, what: str) -> np.ndarray | None:
        return None if not key else table.per_sample(key, what, count)

    context = data.get("context") or None
    if context is not None and not context.get("group_by"):
        raise ValueError("data.context needs group_by (the array naming each row's recording)")
    if splits == ["all"]:  # prediction: neither split nor groups are needed
        rows_of = {"all": np.arange(count)}
    else:
        group_key = data.get("group") or (context or {}).get("group_by")
        groups = per_sample(group_key, "group")
        split = per_sample(data.get("split"), "split")
        rows_of = resolve_splits(
            count,
            split=split,
            groups=groups,
            validation_fraction=float(data.get("validation_fraction", 0.15)),
            test_fraction=float(data.get("test_fraction", 0.2)),
            seed=int(data.get("split_seed", 0)),
            split_values=data.get("split_values"),
            origin=origin,
        )
        if splits is not None:
            rows_of = {key: rows_of[key] for key in splits}
    used = np.zeros(count, dtype=bool)
    for rows in rows_of.values():
        used[rows] = True
    train_rows = rows_of.get("train", np.arange(count))

    label_name = data.get("label", "label")
    targets, info = None, dict(label_info or {})
    if label_name in table or require_labels:
        raw = table.get(label_name, "the label")
        if raw.shape[0] != count:
            raise ValueError(f"{origin}: label array {label_name!r} has {raw.shape[0]} rows, modalities have {count}")
        targets, info = encode_labels(
            raw, label_kind, train_rows, task, origin=origin, label_info=label_info,
            documented_range=table.label_range, where=table.where, dataset=table.dataset,
        )
        for rows in rows_of.values():
            _check_labels(origin, targets, rows, label_kind, info)

    fitted = {}
    for name, modality in zip(names, features, strict=True):
        if stats is not None:
            if name not in stats:
                raise ValueError(f"the checkpoint has no statistics for modality {name!r}")
            if stats[name].mean.shape[0] != modality.shape[-1]:
                raise ValueError(
                    f"{origin}: modality {name!r} has {modality.shape[-1]} features, the checkpoint "
                    f"was trained with {stats[name].mean.shape[0]}"
                )
        modality.used, modality.nonfinite = used, policy
        found = _scan(modality, train_rows, fit=stats is None)
        modality.stats = fitted[name] = stats[name] if stats is not None else found
        modality.standardize = bool(data.get("standardize", True))

    built: dict[str, Split] = {}
    for key, rows in rows_of.items():
        if context is None:
            built[key] = Split(rows)
            continue
        for name, array in zip(names, features, strict=True):
            if array.shape[1] != 1:
                raise ValueError(
                    f"{origin}: contextual mode needs one vector per row, but modality {name!r} "
                    f"is a sequence of {array.shape[1]} steps"
                )
        order_key = context.get("order_by")
        order = per_sample(order_key, "order") if order_key else np.arange(count)
        windows, centre = context_windows(rows, per_sample(context["group_by"], "group"), order, context.get("window"))
        built[key] = Split(rows, windows, centre)
    ids = per_sample(data.get("id"), "id") if data.get("id") and data["id"] in table else None
    lengths = [modality.lengths for modality in features]
    return TabularData(origin, names, features, lengths, targets, built, fitted, info, ids)
