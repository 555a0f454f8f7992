"""A tiny configuration on synthetic data: every engine test trains in seconds."""

import pytest
from tests.tiny.synthetic import engine_config


@pytest.fixture
def tiny_config(tmp_path):
    """``tiny_config(**sections)``: :func:`tests.tiny.synthetic.engine_config` under this
    test's temporary folder, ``sections`` merged over it."""
    return lambda **sections: engine_config(tmp_path, **sections)
