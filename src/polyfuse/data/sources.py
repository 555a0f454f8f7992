"""Data sources: a feature file, or a generator, named by one string.

- ``path/to/features.npz`` or ``.h5``: the generic format of :mod:`polyfuse.data.arrays`;
- ``synthetic:key=value,...``: the planted-interaction task of
  :mod:`polyfuse.data.synthetic`, generated in memory, so that every pipeline runs
  without any file. Keys: ``samples``, ``modalities``, ``lengths`` and ``dims``
  (``/``-separated, cycled over the modalities), ``chunks``, ``distractors``,
  ``noise``, ``signal``, ``min_length_fraction``, ``seed``, ``test_fraction``.
  It yields modalities ``m0, m1, ...`` with ``m<j>_lengths``, a ``label`` of +1 / -1
  (the parity of the planted signs), a ``split`` (the last ``test_fraction`` of
  the rows are ``test``) and ``aligned_step`` (N, m).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.data.arrays import ArrayTable, load_arrays
from polyfuse.data.formats.word_aligned import is_word_aligned, load_word_aligned
from polyfuse.data.synthetic import parse_synthetic_options, planted_interaction

__all__ = [
    "SYNTHETIC_DEFAULTS",
    "is_synthetic",
    "load_source",
    "parse_synthetic",
    "synthetic_modalities",
    "synthetic_table",
]

SYNTHETIC_PREFIX = "synthetic"
SYNTHETIC_DEFAULTS: dict[str, Any] = {
    "samples": 1000,
    "modalities": 3,
    "lengths": (8, 10, 12),
    "dims": (16, 12, 8),
    "chunks": 4,
    "distractors": 1,
    "noise": 1.0,
    "signal": 3.0,
    "min_length_fraction": 0.75,
    "seed": 0,
    "test_fraction": 0.2,
}
MAX_SYNTHETIC_SAMPLES = 10_000_000
MAX_SYNTHETIC_VALUES = 500_000_000  # 2 GB of float32
_INT_KEYS = {"samples", "modalities", "chunks", "distractors", "seed"}
_TUPLE_KEYS = {"lengths", "dims"}


def _synthetic_value(key: str, text: str) -> Any:
    try:
        if key in _TUPLE_KEYS:
            return tuple(int(v) for v in text.split("/"))
        return int(text) if key in _INT_KEYS else float(text)
    except ValueError:
        raise ValueError(f"synthetic option {key}={text!r} is not a valid number") from None


def parse_synthetic(spec: str) -> dict[str, Any]:
    """The generator options of ``synthetic`` or ``synthetic:key=value,...``."""
    options = parse_synthetic_options(spec, SYNTHETIC_DEFAULTS, _synthetic_value)
    if not 10 <= options["samples"] <= MAX_SYNTHETIC_SAMPLES:
        raise ValueError(f"synthetic: samples must lie in [10, {MAX_SYNTHETIC_SAMPLES}], got {options['samples']}")
    for key in ("lengths", "dims"):
        if not options[key] or min(options[key]) < 1:
            raise ValueError(f"synthetic: {key} must be positive integers, got {'/'.join(map(str, options[key]))}")
    for key in ("modalities", "chunks"):
        if options[key] < 1:
            raise ValueError(f"synthetic: {key} must be >= 1, got {options[key]}")
    if options["distractors"] < 0:
        raise ValueError(f"synthetic: distractors must be >= 0, got {options['distractors']}")
    if not 0 <= options["seed"] <= 2**32 - 1:
        raise ValueError(f"synthetic: seed must lie in [0, {2**32 - 1}], got {options['seed']}")
    for key in ("noise", "signal"):
        if not np.isfinite(options[key]) or options[key] < 0:
            raise ValueError(f"synthetic: {key} must be a finite number >= 0, got {options[key]}")
    if not 0.0 < options["min_length_fraction"] <= 1.0:
        raise ValueError(f"synthetic: min_length_fraction must lie in (0, 1], got {options['min_length_fraction']}")
    cells = options["samples"] * sum(
        options["lengths"][j % len(options["lengths"])] * options["dims"][j % len(options["dims"])]
        for j in range(options["modalities"])
    )
    if cells > MAX_SYNTHETIC_VALUES:
        raise ValueError(
            f"synthetic: {cells:,} feature values (samples x lengths x dims) exceed {MAX_SYNTHETIC_VALUES:,}; "
            "lower samples, lengths or dims"
        )
    if not 0.0 < options["test_fraction"] < 1.0:
        raise ValueError(f"synthetic: test_fraction must lie in (0, 1), got {options['test_fraction']}")
    return options


def synthetic_table(spec: str) -> ArrayTable:
    """Generate the planted-interaction task as named arrays (see the module docstring)."""
    options = parse_synthetic(spec)
    data = planted_interaction(
        options["samples"],
        num_modalities=options["modalities"],
        lengths=options["lengths"],
        feature_dims=options["dims"],
        chunks=options["chunks"],
        distractors=options["distractors"],
        noise=options["noise"],
        signal=options["signal"],
        min_length_fraction=options["min_length_fraction"],
        seed=options["seed"],
    )
    count = len(data)
    arrays: dict[str, np.ndarray] = {}
    for j, (x, mask) in enumerate(zip(data.inputs, data.masks, strict=True)):
        arrays[f"m{j}"] = x.numpy()
        arrays[f"m{j}_lengths"] = mask.sum(dim=1).numpy().astype(np.int64)
    arrays["label"] = data.labels.numpy()
    split = np.full(count, "train", dtype="U5")
    split[round(count * (1 - options["test_fraction"])) :] = "test"
    arrays["split"] = split
    arrays["aligned_step"] = data.aligned_steps.numpy()
    arrays["sample_id"] = np.arange(count)
    return ArrayTable(spec, arrays)


def is_synthetic(source: str) -> bool:
    return source == SYNTHETIC_PREFIX or source.startswith(SYNTHETIC_PREFIX + ":")


def load_source(
    source: str,
    *,
    base: str | Path | None = None,
    padding: str = "auto",
    label_range: Any = None,
    modalities: Any = None,
) -> ArrayTable:
    """The arrays of a data source: a ``synthetic:...`` spec or a file path.

    A directory in the word-aligned MFN layout is read by
    :func:`~polyfuse.data.formats.word_aligned.load_word_aligned` (``padding``,
    ``label_range``, ``modalities``: see there; only the named modalities are read,
    default all present). A relative path is tried as given and, failing that, relative to ``base``
    (the directory of the configuration file that named it).
    """
    if not isinstance(source, str) or not source:
        raise ValueError("no data source: set data.source or --data (a .npz/.h5 file or synthetic:...)")
    if is_synthetic(source):
        return synthetic_table(source)
    path = Path(source).expanduser()
    if not path.is_absolute() and not path.exists() and base is not None and (Path(base) / path).exists():
        path = Path(base) / path
    if is_word_aligned(path):  # a new_data/<dataset>/ directory of the MFN layout
        return load_word_aligned(path, modalities=modalities, padding=padding, label_range=label_range)
    return load_arrays(path)


def synthetic_modalities(source: str) -> list[str]:
    """The modality names a synthetic source yields."""
    return [f"m{j}" for j in range(parse_synthetic(source)["modalities"])]
