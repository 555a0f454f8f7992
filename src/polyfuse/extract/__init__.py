"""Feature extraction from images with pre-trained CNNs into cached HDF5 files."""
