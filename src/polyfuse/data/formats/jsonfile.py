"""Reading JSON files that polyfuse did not write: one line naming the file (and the
entry and field) for every way such a file can be wrong, never a traceback.

:func:`read_json` refuses bytes that are not UTF-8 (naming the offset), invalid or
truncated JSON (naming the line and column), nesting deeper than Python's recursion
limit (json's decoder stops there cleanly) and files over :data:`MAX_JSON_BYTES`. :func:`entry_field`
reads one field of one entry of a list, refusing an entry that is not an object and a
field that is missing or of the wrong type.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MAX_JSON_BYTES", "entry_field", "iter_json_list", "json_list", "read_json"]

#: the largest JSON file read (VQA 2.0's training annotations take 330 MB)
MAX_JSON_BYTES = 2 << 30


def _check_file(path: Path) -> None:
    if not path.is_file():
        if path.is_dir():
            raise ValueError(f"{path} is a directory, not a JSON file")
        raise FileNotFoundError(f"JSON file not found: {path}")
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{path}: {size} bytes, over the limit of {MAX_JSON_BYTES} bytes for a JSON file")


def read_json(path: str | Path) -> Any:
    """The content of a JSON file; any problem is a ValueError (FileNotFoundError when
    absent) naming the file."""
    path = Path(path)
    _check_file(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start}); save it as UTF-8"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}: not valid JSON (truncated?): {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:  # json's C decoder stops at Python's recursion limit, cleanly
        raise ValueError(f"{path}: JSON nested too deeply (over {sys.getrecursionlimit()} levels)") from None


def iter_json_list(path: str | Path, key: str) -> Iterator[Any]:
    """The entries of the list under ``key`` of the JSON object in ``path``, parsed one
    at a time, with the messages of :func:`read_json` and :func:`json_list`."""
    import ijson

    path = Path(path)
    _check_file(path)
    if _bracket_depth(path) > _STREAMED_DEPTH:
        # ijson builds a prefix string per level (quadratic memory for a hostile nesting);
        # the standard parser refuses deep nesting cleanly, and reads the rare real file
        # whose strings are full of brackets
        yield from json_list(read_json(path), path, key)
        return
    count = 0
    with path.open("rb") as handle:
        if handle.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            handle.seek(0)
        try:
            for entry in ijson.items(handle, f"{key}.item", use_float=True):
                count += 1
                yield entry
        except ijson.JSONError as error:  # the standard parser names the byte, line and column
            read_json(path)
            raise ValueError(f"{path}: not valid JSON: {str(error).splitlines()[0]}") from None
    if not count:  # an empty list, or no list under the key: tell them apart
        json_list(read_json(path), path, key)


#: the deepest bracket nesting parsed one entry at a time (VQA's files: 4)
_STREAMED_DEPTH = 64


def _bracket_depth(path: Path, chunk: int = 16 << 20) -> int:
    """The deepest nesting of ``[`` / ``{`` in the file, counting brackets inside strings
    too (an upper bound on the JSON's nesting for files without stray brackets), in
    one pass of ``chunk`` bytes at a time."""
    import numpy as np

    step = np.zeros(256, dtype=np.int32)
    step[[ord("["), ord("{")]], step[[ord("]"), ord("}")]] = 1, -1
    depth = deepest = 0
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            running = np.cumsum(step[np.frombuffer(block, dtype=np.uint8)]) + depth
            deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def json_list(content: Any, path: str | Path, key: str) -> list:
    """The list under ``key`` of a JSON object (``{"questions": [...]}``)."""
    if not isinstance(content, Mapping) or not isinstance(content.get(key), list):
        found = type(content).__name__ if not isinstance(content, Mapping) else f"keys {sorted(content)[:10]}"
        raise ValueError(f"{path}: expected a JSON object with a list under {key!r} (found {found})")
    return content[key]


def entry_field(entry: Any, name: str, path: str | Path, index: int, kind: type | tuple[type, ...]) -> Any:
    """Field ``name`` of entry ``index`` of a list read from ``path``, of type ``kind``
    (``bool`` is never an ``int`` here)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{path}: entry {index} is a {type(entry).__name__} ({_short(entry)}), expected an object")
    if name not in entry:
        raise ValueError(f"{path}: entry {index} has no field {name!r}")
    value = entry[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{path}: entry {index}, field {name!r} is {_short(value)}, expected {names}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
