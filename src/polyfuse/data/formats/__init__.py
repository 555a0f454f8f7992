"""Importers of public data formats (VQA 2.0, easy-VQA, GloVe, region features, Flickr30k Entities)."""
