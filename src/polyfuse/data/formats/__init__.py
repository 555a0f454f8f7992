"""Importers of public data formats, one module per format (VQA 2.0, easy-VQA, GloVe,
region features, Flickr30k Entities, expert features, MSVD captions, word-aligned
CMU-SDK / MFN h5 files)."""

from polyfuse.data.formats.word_aligned import (
    WORD_ALIGNED_DATASETS,
    is_word_aligned,
    load_word_aligned,
)

__all__ = ["WORD_ALIGNED_DATASETS", "is_word_aligned", "load_word_aligned"]
