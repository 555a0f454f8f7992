"""Data: feature files in a generic format, synthetic generators, splits,
contextual windows, standardisation and the Lightning data module."""

from polyfuse.data.arrays import ArrayTable, load_arrays
from polyfuse.data.context import context_windows
from polyfuse.data.prepare import LABEL_KINDS, Split, TabularData, encode_labels, prepare_data
from polyfuse.data.sources import is_synthetic, load_source, parse_synthetic, synthetic_table
from polyfuse.data.splits import carve_groups, resolve_splits
from polyfuse.data.standardize import FeatureStats, fit_stats
from polyfuse.data.synthetic import PlantedInteraction, planted_interaction

__all__ = [
    "LABEL_KINDS",
    "ArrayTable",
    "FeatureStats",
    "PlantedInteraction",
    "Split",
    "TabularData",
    "carve_groups",
    "context_windows",
    "encode_labels",
    "fit_stats",
    "is_synthetic",
    "load_arrays",
    "load_source",
    "parse_synthetic",
    "planted_interaction",
    "prepare_data",
    "resolve_splits",
    "synthetic_table",
]
