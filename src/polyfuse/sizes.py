"""Bounds on the sizes a configuration may ask for, checked by the schema before anything
is allocated (an enormous ``hidden_dim`` is a one-line error naming the key, not a
failure inside the allocator).

- :data:`MAX_SIZE` (65536): every layer size, embedding size, rank, head or glimpse
  count, sequence length or beam width of a configuration, and every integer option of
  a fusion module (``model.options.<fusion>``), except those below;
- :data:`MAX_ELEMENTS_OPTION` (2**40): options that are themselves limits on a tensor's
  elements (``max_elements``, ``max_fused_size``, MAN's ``exact_limit``);
- ``seed`` options: numpy's seed range.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

__all__ = ["LARGE_OPTIONS", "MAX_ELEMENTS_OPTION", "MAX_SIZE", "SizeInt", "option_bound"]

MAX_SIZE = 1 << 16
MAX_ELEMENTS_OPTION = 1 << 40
#: fusion options whose integers may exceed MAX_SIZE, and their bound
LARGE_OPTIONS = {"max_elements": MAX_ELEMENTS_OPTION, "max_fused_size": MAX_ELEMENTS_OPTION,
                 "exact_limit": MAX_ELEMENTS_OPTION, "seed": 2**32 - 1}

#: a size: an integer in [1, MAX_SIZE]
SizeInt = Annotated[int, Field(ge=1, le=MAX_SIZE)]


def option_bound(name: str) -> int:
    """The largest integer the fusion option ``name`` accepts."""
    return LARGE_OPTIONS.get(name, MAX_SIZE)
