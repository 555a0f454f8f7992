"""Video features for captioning, cached in one HDF5 file (``polyfuse extract video``)."""

from __future__ import annotations

from polyfuse.extract.decode import frame_indices, sample_frames

__all__ = ["frame_indices", "sample_frames"]
