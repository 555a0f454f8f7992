"""What every figure shares: matplotlib's pyplot with the Agg backend, and saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, out: str | Path, *, dpi: int = 110, **options: Any) -> Path:
    """Write ``figure`` to ``out`` (its folder made), close it, and return the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=dpi, **options)
    pyplot().close(figure)
    return out
