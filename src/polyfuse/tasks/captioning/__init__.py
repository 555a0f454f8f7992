"""Task type captioning: Low-Rank HOCA's caption decoder on video features (``spec.py``:
the spec and Lightning module; ``data.py``: features, captions, batches and shares;
``figure.py``: a video's caption and MAF's attention per word)."""
