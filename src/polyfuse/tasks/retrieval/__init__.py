"""Task type retrieval: text-to-video retrieval over experts (``spec.py``: the spec and
Lightning module; ``figure.py``: a query's scores against a split's videos, for the ranking
figure); ``tasks/ranking/`` holds what it shares with Chimera."""
