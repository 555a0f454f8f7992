"""Small helpers shared by the test files: a free TCP port (``ports``), callbacks and
readers of training runs (``runs``), ban-vqa's checkpoint layout (``ban_vqa``)."""
