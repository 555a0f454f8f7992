"""Task types sentiment, traits and classification: fused features of aligned
modalities to a score, traits or a class (``spec.py``; data from ``polyfuse.data``)."""
