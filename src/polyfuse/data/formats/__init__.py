"""Importers of public data formats, one module per format (VQA 2.0, easy-VQA, GloVe,
region features, Flickr30k Entities, expert features, MSVD captions, word-aligned
CMU-SDK / MFN h5 files)."""
