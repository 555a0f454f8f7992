"""Contextual mode: each sample is the window of its group (video) around it.

For data whose rows are steps of a longer recording (utterances of a video),
``group_by`` names the recording and ``order_by`` the position in it (a start
time). A sample then becomes the sequence of the ``window`` rows of its group
around it, in order, and the model predicts the row at the window's ``centre``
position. Windows never cross a split: a training sample's context holds
training rows only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["context_windows"]


def context_windows(
    rows: np.ndarray, groups: np.ndarray, order: np.ndarray, window: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of row indices around every row of ``rows``.

    Args:
        rows: (n,) row indices of one split; the samples, in this order.
        groups: (N,) group key of every row of the table.
        order: (N,) sort key of every row within its group (ties keep row order).
        window: W, the number of rows per window; None or 0 for whole groups (W is
            then the largest group). A group with at least W rows gives every row a
            full window of W consecutive rows, as centred on it as the group's ends
            allow; a shorter group gives its whole ordered sequence.

    Returns:
        ``(windows, centre)``: (n, W) int64 row indices, real rows first and -1 for
        padding; (n,) int64, the position of the sample's own row in its window.
    """
    rows = np.asarray(rows, dtype=np.int64)
    keys = groups[rows]
    sort = np.lexsort((rows, order[rows], keys))  # by group, then order, then row
    sorted_rows, sorted_keys = rows[sort], keys[sort]
    boundaries = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    runs = np.split(sorted_rows, boundaries) if rows.size else []
    longest = max((run.size for run in runs), default=1)
    width = longest if not window else int(window)
    if width < 1:
        raise ValueError(f"data.context.window must be >= 1 or 0 (whole groups), got {window}")
    windows = np.full((rows.size, width), -1, dtype=np.int64)
    centre = np.zeros(rows.size, dtype=np.int64)
    position_of_row = {int(row): i for i, row in enumerate(rows)}
    for run in runs:
        size = run.size
        for position, row in enumerate(run):
            start = 0 if size <= width else min(max(0, position - width // 2), size - width)
            piece = run[start : start + width]
            sample = position_of_row[int(row)]
            windows[sample, : piece.size] = piece
            centre[sample] = position - start
    return windows, centre
