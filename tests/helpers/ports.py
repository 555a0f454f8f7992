"""A free TCP port on the loopback interface, for the rendezvous of multi-process runs
(also the ``free_port`` fixture of tests/conftest.py)."""

import socket


def free_port() -> int:
    """A port that the system just gave out and released (free unless another process
    takes it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
