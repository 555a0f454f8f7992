"""Word vectors from a GloVe-format text file (``word v_1 ... v_d`` per line)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["load_glove"]


def load_glove(path: str | Path, words: Sequence[str], *, dim: int = 300) -> tuple[Tensor, int]:
    """Rows of the GloVe file for ``words``: a (len(words), dim) tensor and how many were found.

    Words absent from the file keep a row of zeros (as ban-vqa's ``create_embedding``).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a line whose vector does not have ``dim`` numbers (naming the line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GloVe file {path} does not exist")
    wanted = {w: i for i, w in enumerate(words)}
    table = torch.zeros(len(words), dim)
    found = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.rstrip().split(" ")
            if len(parts) < 2 or parts[0] not in wanted:
                continue
            if len(parts) - 1 != dim:
                raise ValueError(f"{path}, line {number}: {len(parts) - 1} numbers, expected {dim}")
            try:
                table[wanted[parts[0]]] = torch.tensor([float(v) for v in parts[1:]])
            except ValueError:
                raise ValueError(f"{path}, line {number}: not a row of numbers") from None
            found += 1
    return table, found
