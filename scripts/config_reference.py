"""Write docs/CONFIGURATION.md from the configuration schema (polyfuse.engine.schema).

    python scripts/config_reference.py           # (re)write the file
    python scripts/config_reference.py --check   # exit 1 when the file is out of date
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from polyfuse.engine.schema import RunConfig, fusion_option_model  # noqa: E402

TARGET = ROOT / "docs" / "CONFIGURATION.md"
#: the line after which the file is written by hand (the defaults against the papers, with
#: their measurements); the script keeps what follows it as it is
HAND_WRITTEN = "<!-- Written by hand below this line: scripts/config_reference.py keeps it. -->"


def _type_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is typing.Literal:
        return " / ".join(repr(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else _type_text(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _type(annotation: Any) -> str:
    return _type_text(annotation).replace("|", "\\|")


def _constraints(field: Any) -> str:
    parts = []
    for item in field.metadata:
        for name, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length"), ("max_length", "max length")):
            value = getattr(item, name, None)
            if value is not None:
                parts.append(f"{symbol} {value}")
    for arg in typing.get_args(field.annotation):  # constraints inside Optional[Annotated[...]]
        for item in getattr(arg, "__metadata__", ()):
            for name, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                value = getattr(item, name, None)
                if value is not None:
                    parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _section(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    nested = []
    lines += [f"### `{prefix or '(top level)'}`", "", (model.__doc__ or "").strip(), ""]
    lines += ["| key | type | default | range | meaning |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        annotation = field.annotation
        sub = next((a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None:
            nested.append((sub, key))
        type_text = f"section `{key}`" if sub is not None else _type(annotation)
        lines.append(f"| `{key}` | {type_text} | {_default(field)} | {_constraints(field)} | {(field.description or '').replace('|', chr(92) + '|')} |")
    lines.append("")
    for sub, key in nested:
        _section(sub, key, lines)


def render() -> str:
    import polyfuse.nn

    lines = [
        "# Configuration reference",
        "",
        "Generated from `polyfuse.engine.schema` by `python scripts/config_reference.py`;",
        "do not edit by hand (a test checks that this file is up to date), except the last part,\n"
        "[Defaults against the papers](#defaults-against-the-papers), written by hand.",
        "",
        "Every key is checked: an unknown key is an error with a did-you-mean, and values",
        "are checked for type (no `true` where an integer goes) and range. Paths written in",
        "a config file (`data.source`, `output_dir`) are relative to that file. `--set",
        "SECTION=VALUE` never replaces a section: give a mapping (`--set 'trainer={patience: 3}'`)",
        "or set one key (`--set trainer.patience=3`).",
        "",
    ]
    _section(RunConfig, "", lines)
    lines += [
        "## `model.options.<fusion>`",
        "",
        "The keyword arguments of each fusion module's constructor, read from its",
        "signature; the module itself checks their ranges when it is built. Before that, every",
        "integer option (and every integer of a list option) is at most 65536",
        "(`polyfuse.sizes.MAX_SIZE`), so an enormous size is refused naming its key before",
        "anything is allocated; `max_elements` and `max_fused_size` (limits themselves) are at",
        "most 2**40, `seed` at most 2**32 - 1.",
        "",
    ]
    for name in polyfuse.nn.available():
        model = fusion_option_model(name)
        lines += [f"### `model.options.{name}` ({polyfuse.nn.get(name).__name__})", ""]
        lines += ["| key | type | default |", "|---|---|---|"]
        for option, field in model.model_fields.items():
            lines.append(f"| `model.options.{name}.{option}` | {_type(field.annotation)} | {_default(field)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the committed file differs")
    args = parser.parse_args()
    current = TARGET.read_text() if TARGET.is_file() else ""
    _, marker, tail = current.partition(HAND_WRITTEN)
    text = render() + ("\n" + marker + tail if marker else "")
    if args.check:
        if current != text:
            print(f"{TARGET} is out of date: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
