"""The ``polyfuse`` command line."""
