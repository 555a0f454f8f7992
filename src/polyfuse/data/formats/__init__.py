"""Importers of public data layouts into named arrays (:class:`~polyfuse.data.arrays.ArrayTable`)."""

from polyfuse.data.formats.word_aligned import (
    WORD_ALIGNED_DATASETS,
    is_word_aligned,
    load_word_aligned,
)

__all__ = ["WORD_ALIGNED_DATASETS", "is_word_aligned", "load_word_aligned"]
