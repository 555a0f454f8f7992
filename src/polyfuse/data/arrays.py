"""Reading feature files: ``.npz`` and ``.h5``, one array per name.

The generic format (see docs/TRAINING.md):

- one array per modality, ``(N, T_j, d_j)`` (a sequence per sample, real steps
  first) or ``(N, d_j)`` (one vector per sample), float;
- optional ``<modality>_lengths``: ``(N,)`` ints, the real steps of each sample
  (default: all T_j);
- a label array, ``(N,)`` or ``(N, k)``;
- optional arrays of one value per sample: a split (strings such as
  ``train`` / ``valid`` / ``test``), groups (a video or speaker id), an order
  key (a start time), ids.

Every problem with a file is a ``ValueError`` (or ``FileNotFoundError``) whose
message names the file and the array, raised here and not deep inside torch.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ArrayTable", "load_arrays"]

FEATURE_SUFFIXES = (".npz", ".h5", ".hdf5")


@dataclass
class ArrayTable:
    """Named arrays of a data source; ``origin`` names it in error messages."""

    origin: str
    arrays: dict[str, np.ndarray]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def names(self) -> list[str]:
        return sorted(self.arrays)

    def get(self, name: str, what: str) -> np.ndarray:
        """The array ``name``; a missing one lists the arrays there are."""
        if name not in self.arrays:
            raise ValueError(
                f"{self.origin}: no array {name!r} (wanted as {what}); "
                f"arrays in the file: {', '.join(self.names())}"
            )
        return self.arrays[name]

    def per_sample(self, name: str, what: str, count: int) -> np.ndarray:
        """A one-value-per-sample array of length ``count`` (a split, group or order key)."""
        array = self.get(name, what)
        if array.ndim != 1 or array.shape[0] != count:
            raise ValueError(
                f"{self.origin}: {what} array {name!r} has shape {array.shape}, "
                f"expected ({count},): one value per sample"
            )
        return array


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as error:
        if "allow_pickle" in str(error) or "Object arrays" in str(error):
            raise ValueError(
                f"{path}: holds object (pickled) arrays, which are never loaded; "
                "store strings as fixed-width unicode arrays (dtype 'U')"
            ) from None
        raise ValueError(f"{path}: cannot read as .npz: {error}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"{path}: cannot read as .npz (corrupt or not an npz file): {error}") from None


def _read_h5(path: Path) -> dict[str, np.ndarray]:
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is in the train extra
        raise ValueError(f"{path}: reading .h5 files needs h5py (pip install 'polyfuse[train]')") from None
    arrays: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as handle:

            def visit(name: str, node: object) -> None:
                if isinstance(node, h5py.Dataset):
                    value = node[()]
                    if isinstance(value, np.ndarray) and value.dtype.kind in "OS":
                        value = np.array(
                            [v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel()]
                        ).reshape(value.shape)
                    arrays[name] = np.asarray(value)

            handle.visititems(visit)
    except OSError as error:
        raise ValueError(f"{path}: cannot read as HDF5 (corrupt or not an HDF5 file): {error}") from None
    return arrays


def load_arrays(path: str | Path) -> ArrayTable:
    """Read every array of an ``.npz`` or ``.h5`` file (datasets of an .h5 file by their path)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        arrays = _read_npz(path)
    elif suffix in (".h5", ".hdf5"):
        arrays = _read_h5(path)
    else:
        raise ValueError(
            f"{path}: unknown data format {suffix or '(no suffix)'!r}; expected one of "
            f"{', '.join(FEATURE_SUFFIXES)} or a 'synthetic:...' source"
        )
    if not arrays:
        raise ValueError(f"{path}: holds no arrays")
    return ArrayTable(str(path), arrays)
