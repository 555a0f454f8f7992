"""Pure tensor math, no parameters: every function states its argument shapes and
cites the equation it implements."""

__all__: list[str] = []
