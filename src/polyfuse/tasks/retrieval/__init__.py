"""Task type retrieval: text-to-video retrieval over experts (``spec.py``: the spec and
Lightning module; ``figure.py``: a query's top videos); ``tasks/ranking/`` holds what it
shares with Chimera."""
