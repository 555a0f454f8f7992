"""Train / validation / test splits of the rows of a table.

The test rows come from the file's split array (or, without one, from a seeded
draw of whole groups). The validation rows come from the file's split array when
it has some, and are otherwise carved out of the *training* rows by whole groups
(videos, speakers: a group is never on both sides), never from the test rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["DEFAULT_SPLIT_VALUES", "carve_groups", "resolve_splits"]

DEFAULT_SPLIT_VALUES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "val": ("val", "valid", "validation", "dev"),
    "test": ("test",),
}


def carve_groups(
    rows: np.ndarray, groups: np.ndarray | None, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``rows`` into (kept, carved) by whole groups.

    Args:
        rows: (n,) row indices.
        groups: (N,) group key of every row of the table, or None (each row is a group).
        fraction: the share of the groups to carve out, at least one group and at
            most all but one.
        seed: the groups are shuffled by a generator seeded with it.

    Returns:
        Two sorted arrays of row indices, disjoint, together ``rows``.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the fraction to carve out must lie in (0, 1), got {fraction}")
    keys = rows if groups is None else groups[rows]
    unique = np.unique(keys)
    if unique.size < 2:
        raise ValueError(
            f"cannot carve a held-out part by groups out of {unique.size} group(s); "
            "give a split array with the held-out rows or use more groups"
        )
    order = np.random.default_rng(seed).permutation(unique.size)
    count = min(unique.size - 1, max(1, round(fraction * unique.size)))
    carved_keys = unique[order[:count]]
    carved = np.isin(keys, carved_keys)
    return np.sort(rows[~carved]), np.sort(rows[carved])


def resolve_splits(
    count: int,
    *,
    split: np.ndarray | None,
    groups: np.ndarray | None,
    validation_fraction: float,
    test_fraction: float,
    seed: int,
    split_values: Mapping[str, Sequence[str]] | None = None,
    origin: str = "data",
) -> dict[str, np.ndarray]:
    """Row indices of the ``train``, ``val`` and ``test`` splits.

    Args:
        count: N, the number of rows.
        split: (N,) split names (compared as strings), or None.
        groups: (N,) group keys for carving, or None (rows are their own groups).
        validation_fraction: share of the training groups carved out for
            validation when the split array has no validation rows.
        test_fraction: share of all groups drawn for test when there is no split array.
        seed: seed of both draws.
        split_values: which split names mean train / valid / test
            (default :data:`DEFAULT_SPLIT_VALUES`).
    """
    values = {key: tuple(DEFAULT_SPLIT_VALUES[key]) for key in DEFAULT_SPLIT_VALUES}
    for key, names in (split_values or {}).items():
        if key not in values:
            raise ValueError(f"data.split_values: unknown split {key!r}; expected train, val, test")
        values[key] = tuple(str(name) for name in names)
    all_rows = np.arange(count)
    def carve(rows: np.ndarray, fraction: float, draw: int, part: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            return carve_groups(rows, groups, fraction, draw)
        except ValueError as error:
            raise ValueError(f"{origin}: carving the {part} part: {error}") from None

    if split is None:
        train, test = carve(all_rows, test_fraction, seed + 1, "test")
        val = np.array([], dtype=np.int64)
    else:
        names = split.astype(str)
        known = {name for group in values.values() for name in group}
        unknown = sorted(set(np.unique(names).tolist()) - known)
        if unknown:
            raise ValueError(
                f"{origin}: unknown split value(s) {unknown[:5]}; known: "
                + "; ".join(f"{key}: {', '.join(group)}" for key, group in values.items())
                + " (set data.split_values to map others)"
            )
        train, val, test = (all_rows[np.isin(names, values[key])] for key in ("train", "val", "test"))
    if train.size == 0:
        raise ValueError(f"{origin}: the split has no training rows")
    if val.size == 0:
        train, val = carve(train, validation_fraction, seed, "validation")
    return {"train": train, "val": val, "test": test}
