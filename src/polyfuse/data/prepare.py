"""From named arrays to model-ready data: modalities, labels, splits, windows.

:func:`prepare_data` applies the ``data`` section of a configuration to an
:class:`~polyfuse.data.arrays.ArrayTable`: it picks the modalities, checks every
shape, handles non-finite values, encodes the labels for the task, resolves the
train / valid / test splits, standardises with training statistics and, in
contextual mode, builds the windows.

Shapes: ``N`` rows, ``T_j`` steps and ``d_j`` features of modality j, ``k`` targets,
``W`` window length.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyfuse.data.arrays import ArrayTable
from polyfuse.data.context import context_windows
from polyfuse.data.formats.word_aligned import move_real_steps_to_front, zero_padding_real_steps
from polyfuse.data.splits import resolve_splits
from polyfuse.data.standardize import FeatureStats, fit_stats, real_steps

__all__ = ["LABEL_KINDS", "OUT_OF_RANGE_POLICIES", "Split", "TabularData", "encode_labels", "prepare_data", "trait_key"]

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

    features[j]: (N, T_j, d_j) float32 (contextual mode: T_j = 1), padded steps 0.
    lengths[j]: (N,) int64 real steps. targets: (N,) float32 (sentiment), (N, k)
    float32 (traits), (N,) int64 class indices (classification), or None without
    labels. stats: the training statistics per modality (applied when
    ``data.standardize`` is on; the means also fill imputed values).
    """

    origin: str
    modalities: list[str]
    features: list[np.ndarray]
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


def _modality(table: ArrayTable, name: str, padding: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(N, T, d) float array and (N,) lengths of one modality.

    ``padding``: ``auto`` reads the generic layout (real steps first, lengths from
    ``<name>_lengths`` or all steps); ``left`` / ``right`` find each sample's real steps
    from its zero padding (zeros first / last) and move them to the front, as the
    word-aligned importer does; they exclude a lengths array."""
    array = table.get(name, "a modality")
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{table.origin}: modality {name!r} has dtype {array.dtype}, not numeric")
    if array.ndim == 2:
        array = array[:, None, :]
    if array.ndim != 3 or 0 in array.shape:
        raise ValueError(
            f"{table.origin}: modality {name!r} has shape {array.shape}; expected (N, T, d) or (N, d)"
        )
    length_name = f"{name}_lengths"
    if padding not in ("auto", "left", "right"):
        raise ValueError(f"data.padding must be one of auto, left, right, got {padding!r}")
    if padding != "auto":
        if length_name in table:
            raise ValueError(
                f"{table.origin}: data.padding: {padding} and the array {length_name!r} both say which steps of "
                f"{name!r} are real; drop data.padding (lengths, real steps first) or the lengths array"
            )
        real = zero_padding_real_steps(array)
        moved, lengths = move_real_steps_to_front(array, real, padding)
        return moved.astype(np.float32), lengths
    if length_name in table:
        lengths = table.per_sample(length_name, f"lengths of {name!r}", array.shape[0])
        if lengths.dtype.kind not in "iu":
            raise ValueError(f"{table.origin}: {length_name!r} must hold integers, got {lengths.dtype}")
        bad = np.flatnonzero((lengths < 0) | (lengths > array.shape[1]))  # 0: a missing modality
        if bad.size:
            raise ValueError(
                f"{table.origin}: {length_name!r} is {int(lengths[bad[0]])} at row {int(bad[0])}; "
                f"every length must lie in [0, {array.shape[1]}] (T of {name!r}; 0: modality missing)"
            )
        lengths = lengths.astype(np.int64)
    else:
        lengths = np.full(array.shape[0], array.shape[1], dtype=np.int64)
    return array.astype(np.float32), lengths


def _handle_nonfinite(
    origin: str, name: str, features: np.ndarray, real: np.ndarray, used: np.ndarray, policy: str
) -> np.ndarray:
    """Raise on (or impute) NaN / Inf at the real steps of the used rows."""
    bad = ~np.isfinite(features) & real[:, :, None] & used[:, None, None]
    if not bad.any():
        return features
    where = np.argwhere(bad)
    row, step, feature = (int(v) for v in where[0])
    kind = "NaN" if np.isnan(features[row, step, feature]) else "Inf"
    if policy == "error":
        more = f" (and {len(where) - 1} more)" if len(where) > 1 else ""
        raise ValueError(
            f"{origin}: modality {name!r} has {kind} at row {row} (step {step}, feature {feature})"
            f"{more}; fix the file or set data.nonfinite to 'zero' or 'mean' to impute"
        )
    rows = np.unique(where[:, 0])
    log.warning(
        "%s: imputing %d non-finite value(s) of modality %r in %d row(s) (first: row %d) with %s",
        origin, len(where), name, rows.size, row,
        "0" if policy == "zero" else "the training mean of the feature",
    )
    features = features.copy()
    features[bad] = 0.0 if policy == "zero" else np.nan  # NaN: filled by the training mean later
    return features


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
    loaded = [_modality(table, name, padding) for name in names]
    count = loaded[0][0].shape[0]
    for name, (array, _) in zip(names, loaded, strict=True):
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

    features, lengths, fitted = [], [], {}
    for name, (array, length) in zip(names, loaded, strict=True):
        real = real_steps(length, array.shape[1])
        array = _handle_nonfinite(origin, name, array, real, used, policy)
        if stats is not None:
            if name not in stats:
                raise ValueError(f"the checkpoint has no statistics for modality {name!r}")
            modality_stats = stats[name]
            if modality_stats.mean.shape[0] != array.shape[-1]:
                raise ValueError(
                    f"{origin}: modality {name!r} has {array.shape[-1]} features, the checkpoint "
                    f"was trained with {modality_stats.mean.shape[0]}"
                )
        else:
            modality_stats = fit_stats(array, length, train_rows)
        if data.get("standardize", True):
            array = modality_stats.apply(array)
            fill = np.zeros(array.shape[-1], dtype=np.float32)
        else:
            fill = modality_stats.mean
        array = np.where(np.isnan(array), fill, array)  # the 'mean' imputation
        array = np.where(real[:, :, None], array, 0.0).astype(np.float32)
        features.append(array)
        lengths.append(length)
        fitted[name] = modality_stats

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
    return TabularData(
        origin, names, features, lengths, targets, built, fitted, info, ids
    )
