"""The code blocks of README.md and docs/*.md, and the shell commands in them.

One reader for every test that checks or runs documented commands: tests/test_docs_commands.py,
and any test that runs the commands behind a documented result (the paper rows):

- ``doc_files()``: README.md and docs/*.md;
- ``code_blocks(path)``: every fenced block with its file, line, language and flags;
  ``indented_code(path)``: the lines Markdown would show as an indented code block
  (the docs have none: every block is fenced, so that its language is said);
- ``shell_blocks()``: the blocks of a shell language;
- ``commands(block)``: its simple commands, each with its line, its text as written
  and its words as bash would pass them (quotes removed, variables that the block
  set expanded, ``$(...)`` kept as the placeholder ``$(...)`` and its inner commands
  listed too, comments, redirections and ``for`` / ``do`` / ``done`` dropped);
- ``Block.script()``: the block's commands as bash runs them (console prompts and
  output removed); ``Block.output_lines()``: a console block's output;
- ``run_block(block, home)``: runs a block as a reader would, in a fresh bash after
  the README's set-up (``ACTIVATE``);
- ``config_keys(sections)``: the configuration keys the docs name (``KeyMention``):
  dotted names in inline code whose first part is one of ``sections`` (the top-level
  sections of the run configuration), the keys of the ``yaml`` blocks that are
  configurations, and the ``--set KEY=VALUE`` keys of the shell blocks.

The rule the docs follow (docs/TESTING.md, "Commands in the docs"):

- every code block is fenced and its info string starts with its language:
  ``bash`` (also ``sh``, ``shell``) holds only commands, comments and continuation
  lines; ``console`` holds commands after a ``$ `` prompt and, on the other lines,
  their output; ``text`` holds output, file layouts and usage synopses (never run);
  ``python``, ``yaml``, ``json``: what they say;
- a second word ``run`` (```` ```bash run ````) marks a shell block that the tests
  execute, from the repository root, in a fresh shell after the README's set-up
  (``. .venv/bin/activate``): such a block must be cheap (seconds), need nothing
  outside the repository and its virtualenv, and write nothing into the repository.

This is not a shell: it reads the subset the docs use (words, single and double
quotes, backslashes, ``$NAME`` / ``${NAME}``, ``$(...)``, ``;`` ``&&`` ``||`` ``|``
``&``, redirections, comments, ``for NAME in ...; do ...; done``, ``if``) and refuses
backquotes.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ACTIVATE",
    "ROOT",
    "SHELL_LANGUAGES",
    "Block",
    "Command",
    "IncompleteCommand",
    "KeyMention",
    "code_blocks",
    "commands",
    "config_keys",
    "doc_files",
    "fresh_environment",
    "indented_code",
    "run_block",
    "shell_blocks",
    "split_commands",
]

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
SUBSTITUTION = "$(...)"  # the word a command substitution stands as (it is never run here)
# The README's set-up line that every doc assumes (README.md, "Set-up"): it puts .venv's
# polyfuse and python first on the PATH.
ACTIVATE = ". .venv/bin/activate"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_LIST_ITEM = re.compile(r"^(?P<indent> *)(?:[-*+]|\d{1,9}[.)])(?P<gap> {1,4}|$)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_REDIRECTION = re.compile(r"\d*(?:>>|>&|<&|&>|>|<)")
_RESERVED_PREFIXES = frozenset({"do", "then", "else", "elif", "if", "while", "until", "time", "!", "{"})
_RESERVED_ALONE = frozenset({"done", "fi", "}", "esac"})
# Commands that run the command after their own options: `timeout -s INT 9 polyfuse ...`.
_WRAPPERS = {"env": (), "nice": ("-n",), "nohup": (), "time": (), "/usr/bin/time": (), "timeout": ("-s", "-k")}


@dataclass(frozen=True)
class Block:
    """A fenced code block: ``path`` relative to the repository root, ``line`` of its
    opening fence (1-based), ``lines`` its content without the fence's indentation."""

    path: Path
    line: int
    language: str
    flags: tuple[str, ...]
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        """Marked ``run``: the tests execute it."""
        return "run" in self.flags

    def command_lines(self) -> list[tuple[int, str]]:
        """``(line in the file, text)`` of the lines bash would read: every line of a
        bash block; in a console block the ``$ `` lines without the prompt, and the lines
        that continue them (after a trailing backslash or inside open quotes)."""
        numbered = [(self.line + 1 + k, text) for k, text in enumerate(self.lines)]
        if self.language != "console":
            return numbered
        kept, open_command = [], ""
        for number, text in numbered:
            if open_command:
                kept.append((number, text))
                open_command += "\n" + text
            elif text.startswith("$ ") or text == "$":
                kept.append((number, text[2:]))
                open_command = text[2:]
            else:
                continue
            if _complete(open_command):
                open_command = ""
        return kept

    def output_lines(self) -> list[tuple[int, str]]:
        """``(line in the file, text)`` of a console block's output: its other lines."""
        if self.language != "console":
            return []
        commands = {number for number, _ in self.command_lines()}
        return [(self.line + 1 + k, text) for k, text in enumerate(self.lines) if self.line + 1 + k not in commands]

    def script(self) -> str:
        """The text bash runs for this block."""
        return "\n".join(text for _, text in self.command_lines()) + "\n"


@dataclass(frozen=True)
class Command:
    """One simple command: ``words`` as bash passes them (``words[0]`` the program,
    after ``env`` the prefix assignments ``NAME=value``), ``text`` as written (the
    logical line it starts on, continuations joined)."""

    path: Path
    line: int
    text: str
    words: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    in_substitution: bool = False

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def argv(self) -> tuple[str, ...]:
        """The words from the program that does the work: ``timeout -s INT 9 polyfuse
        train ...`` and ``nice -n 10 polyfuse ...`` give ``("polyfuse", "train", ...)``."""
        words = list(self.words)
        while words and words[0] in _WRAPPERS:
            wrapper = words.pop(0)
            while words and (words[0].startswith("-") or _ASSIGNMENT.match(words[0])):
                option = words.pop(0)
                if option in _WRAPPERS[wrapper] and words:
                    words.pop(0)
            if wrapper == "timeout" and words:
                words.pop(0)  # the duration
        return tuple(words)


class IncompleteCommand(ValueError):
    """The text ends inside quotes, ``$(`` or after a trailing backslash."""


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md, relative to ``root``."""
    return [Path("README.md"), *sorted(p.relative_to(root) for p in (root / "docs").glob("*.md"))]


def code_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of one Markdown file (``path`` relative to ``root``)."""
    blocks, lines = [], (root / path).read_text().splitlines()
    opened = None
    for number, text in enumerate(lines, start=1):
        match = _FENCE.match(text)
        if opened is None:
            if match and not (match["fence"][0] == "`" and "`" in match["info"]):
                info = match["info"].split()
                opened = (number, match["indent"], match["fence"], info, [])
            continue
        start, indent, fence, info, content = opened
        if match and match["fence"][0] == fence[0] and len(match["fence"]) >= len(fence) and not match["info"].strip():
            language = info[0] if info else ""
            blocks.append(Block(path, start, language, tuple(info[1:]), tuple(content)))
            opened = None
        else:
            content.append(text[len(indent):] if text.startswith(indent) else text.lstrip(" "))
    if opened is not None:
        raise ValueError(f"{path}:{opened[0]}: a fence that is never closed")
    return blocks


def indented_code(path: Path, root: Path = ROOT) -> list[int]:
    """Lines (1-based) that Markdown reads as an indented code block: after a blank
    line, indented four spaces or more beyond the list item they would belong to.
    (CommonMark's rule for the docs' subset: ``-``, ``*``, ``+`` and ``1.`` lists.)"""
    found, lines = [], (root / path).read_text().splitlines()
    items: list[int] = []  # the content indentation of each open list item
    in_fence, fence, blank_before, in_code = False, "", True, False
    for number, text in enumerate(lines, start=1):
        match = _FENCE.match(text)
        if in_fence:
            if match and match["fence"][0] == fence[0] and len(match["fence"]) >= len(fence):
                in_fence, blank_before = False, False
            continue
        if not text.strip():
            blank_before = True
            continue
        indent = len(text) - len(text.lstrip(" "))
        if blank_before or in_code:
            while items and indent < items[-1]:
                items.pop()
            base = items[-1] if items else 0
            in_code = indent >= base + 4
            if in_code:
                found.append(number)
                blank_before = False
                continue
        if match and indent < (items[-1] if items else 0) + 4:
            in_fence, fence = True, match["fence"]
            while items and indent < items[-1]:
                items.pop()
        elif item := _LIST_ITEM.match(text):
            while items and indent < items[-1]:
                items.pop()
            gap = len(item["gap"]) if item["gap"] else 1
            items.append(item.end() - len(item["gap"]) + gap)
        blank_before = False
    return found


def fresh_environment(home: Path) -> dict[str, str]:
    """A new login's environment: no virtualenv, no PYTHONPATH, the system's PATH."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp")}


def run_block(block: Block, home: Path, *, root: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell block as a reader would: a fresh ``bash`` (``set -euo pipefail``, so
    the first failing command fails the block) in ``root``, with ``fresh_environment``,
    after the README's activation line; stdout and stderr captured as text."""
    script = f"set -euo pipefail\n{ACTIVATE}\n{block.script()}"
    return subprocess.run(["bash", "-c", script], cwd=root, env=fresh_environment(home),
                          capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class KeyMention:
    """A configuration key a doc names: ``key`` its dotted parts, ``how`` where it
    stands (``prose``: inline code; ``yaml``: a configuration block; ``--set``: a command)."""

    path: Path
    line: int
    key: tuple[str, ...]
    how: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def name(self) -> str:
        return ".".join(self.key)


# Inline code: a run of backquotes, its text, the same run (CommonMark; not across a blank line).
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", re.S)
# A dotted name that starts a word: not a part of a path, a module or an attribute chain;
# before a placeholder (`model.options.<fusion>`) the part before it.
_DOTTED = re.compile(r"(?<![\w./$<{\[-])([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w(/-]|\.\w)")
# What ends a file name, not a key: `data.json`, `model.yaml`.
_FILE_SUFFIXES = frozenset({"yaml", "yml", "json", "md", "py", "csv", "txt", "h5", "npz", "npy", "pt",
                            "safetensors", "log", "png", "html", "toml", "avi", "mp4", "tsv", "zip", "gz"})


def _prose_text(path: Path, root: Path) -> str:
    """The file's text with its fenced blocks blanked (the lines kept, so numbers hold)."""
    lines = (root / path).read_text().splitlines()
    for block in code_blocks(path, root):
        for k in range(block.line - 1, min(block.line + len(block.lines) + 1, len(lines))):
            lines[k] = ""
    return "\n".join(lines)


def _yaml_keys(value, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*prefix, str(key))
            yield from _yaml_keys(inner, (*prefix, str(key)))


def config_keys(sections, root: Path = ROOT) -> list[KeyMention]:
    """The configuration keys README.md and docs/*.md name, in file order (see the module
    docstring); ``sections``: the names a key's first part must be (RunConfig's fields).
    A ``yaml`` block is a configuration when its top level is a mapping with one of
    ``sections`` among its keys; each of its keys (at every depth) is a mention. Not
    mentions: a dotted name that is a file (``data.json``), part of a path, module or
    attribute chain (``polyfuse.data.vqa``, ``self.model.x``), a call
    (``task.model.encode(...)``) or a Python assignment (``task.allow_unknown = True``),
    and a ``--set`` key that a console block shows refused (``unknown config key 'KEY'``)."""
    import yaml

    sections = frozenset(sections)
    found: list[KeyMention] = []
    for path in doc_files(root):
        text = _prose_text(path, root)
        for span in _CODE_SPAN.finditer(text):
            for name in _DOTTED.finditer(span.group(2)):
                parts = tuple(name.group(1).split("."))
                python = re.match(r"\s+=\s", span.group(2)[name.end(1):])  # `task.allow_unknown = True`
                if parts[0] in sections and parts[-1] not in _FILE_SUFFIXES and not python:
                    line = text.count("\n", 0, span.start(2) + name.start(1)) + 1
                    found.append(KeyMention(path, line, parts, "prose"))
        for block in code_blocks(path, root):
            if block.language == "yaml":
                try:
                    content = yaml.safe_load("\n".join(block.lines))
                except yaml.YAMLError:
                    content = None  # not a configuration (a sketch with placeholders)
                if isinstance(content, dict) and sections & set(map(str, content)):
                    found += [KeyMention(path, block.line, key, "yaml") for key in _yaml_keys(content, ())]
            elif block.language in SHELL_LANGUAGES:
                output = "\n".join(text for _, text in block.output_lines())
                for command in commands(block, root):
                    words = command.argv
                    for option, value in itertools.pairwise(words):
                        key = value.split("=", 1)[0]
                        # a console block that shows the command refused names the key on purpose
                        if option == "--set" and "=" in value and f"unknown config key '{key}'" not in output:
                            found.append(KeyMention(path, command.line, tuple(key.split(".")), "--set"))
    return found


def shell_blocks(root: Path = ROOT) -> list[Block]:
    """Every block of a shell language in README.md and docs/*.md, in file order."""
    return [b for path in doc_files(root) for b in code_blocks(path, root) if b.language in SHELL_LANGUAGES]


def commands(block: Block, root: Path = ROOT) -> list[Command]:
    """The simple commands of a shell block, in order; the variables it sets (``S=...``,
    ``for s in 0 1 2``: the first value) are expanded in the commands after them."""
    numbered = block.command_lines()
    return split_commands(
        "\n".join(text for _, text in numbered),
        path=block.path,
        lines=[number for number, _ in numbered],
        root=root,
    )


def split_commands(
    script: str, *, path: Path = Path("-"), lines: list[int] | None = None, root: Path = ROOT,
    variables: dict[str, str] | None = None, in_substitution: bool = False,
) -> list[Command]:
    """The simple commands of a piece of shell text (see ``commands``); ``lines[k]``
    is the number to report for its line ``k`` (default ``k + 1``)."""
    variables = {} if variables is None else variables
    starts = [0] + [m.end() for m in re.finditer("\n", script)]
    line_numbers = lines if lines is not None else list(range(1, len(starts) + 1))

    def line_of(offset: int) -> int:
        index = max(k for k, start in enumerate(starts) if start <= offset)
        return line_numbers[min(index, len(line_numbers) - 1)]

    def logical_text(offset: int) -> str:
        """The text from the start of the line of ``offset`` to the end of its command."""
        begin = max(start for start in starts if start <= offset)
        end = begin
        while True:
            end = script.find("\n", end)
            if end < 0:
                return script[begin:]
            if _complete(script[begin:end]):
                return script[begin:end]
            end += 1

    found: list[Command] = []
    words: list[str] = []
    first_offset = None
    substitutions: list[str] = []
    ending = [("op", "end", len(script))]
    for kind, value, offset in itertools.chain(_tokens(script, variables, substitutions), ending):
        if kind == "word":
            if first_offset is None:
                first_offset = offset
            words.append(value)
            continue
        if words:
            line = line_of(first_offset)
            for inner in substitutions:
                found += split_commands(
                    inner, path=path, lines=[line] * (inner.count("\n") + 1), root=root,
                    variables=dict(variables), in_substitution=True,
                )
            found += _simple_command(words, path, line, logical_text(first_offset), variables, root, in_substitution)
        words, first_offset, substitutions[:] = [], None, []
    return found


def _simple_command(words, path, line, text, variables, root, in_substitution) -> list[Command]:
    while words and words[0] in _RESERVED_PREFIXES:
        words = words[1:]
    if not words or (len(words) == 1 and words[0] in _RESERVED_ALONE):
        return []
    if words[0] == "for":
        if len(words) >= 4 and words[2] == "in":
            items = [item for pattern in words[3:] for item in _glob(pattern, root)]
            variables[words[1]] = items[0] if items else ""
        return []
    if words[0] in ("export", "local", "readonly"):
        words = words[1:]
    env = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        variables.update(env)
    return [Command(path, line, text, tuple(words), env, in_substitution)]


def _glob(pattern: str, root: Path) -> list[str]:
    if not any(c in pattern for c in "*?["):
        return [pattern]
    matches = sorted(glob.glob(pattern, root_dir=root))
    return matches or [pattern]


def _complete(text: str) -> bool:
    try:
        for _ in _tokens(text, {}, []):
            pass
    except IncompleteCommand:
        return False
    return True


def _matching_parenthesis(text: str, start: int) -> int:
    """The index of the ``)`` closing the ``$(`` whose ``(`` is at ``start - 1``."""
    depth, i, quote = 1, start, ""
    while i < len(text):
        c = text[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise IncompleteCommand("an unclosed $(")


def _tokens(text: str, variables: dict[str, str], substitutions: list[str]) -> Iterator[tuple[str, str, int]]:
    """``("word", value, offset)`` and ``("op", operator, offset)``, lazily, so that a
    variable set by one command is expanded in the next one."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
        elif text.startswith("\\\n", i):
            i += 2
        elif c == "\n":
            yield "op", "\n", i
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith(("&&", "||", ";;"), i):
            yield "op", text[i:i + 2], i
            i += 2
        elif c in ";|&()" and not text.startswith("&>", i):
            yield "op", c, i
            i += 1
        elif redirection := _REDIRECTION.match(text, i):
            i = redirection.end()
            if redirection.group().endswith("&") and i < n and (text[i].isdigit() or text[i] == "-"):
                i += 1
                continue
            while i < n and text[i] in " \t":
                i += 1
            _, i = _word(text, i, variables, substitutions)  # the target, dropped
        else:
            start = i
            pieces, i = _word(text, i, variables, substitutions)
            for piece in pieces:
                yield "word", piece, start


def _word(text: str, i: int, variables: dict[str, str], substitutions: list[str]) -> tuple[list[str], int]:
    """The word(s) starting at ``i`` (more than one when an unquoted expansion splits)
    and the index after it."""
    words, current, quoted, n = [], [], False, len(text)

    def expand(value: str, in_quotes: bool) -> None:
        nonlocal current, quoted
        if in_quotes:
            current.append(value)
            return
        fields = value.split()
        if not fields:
            return
        if value[0].isspace() and (current or quoted):
            words.append("".join(current))
            current, quoted = [], False
        for k, piece in enumerate(fields):
            if k:
                words.append("".join(current))
                current, quoted = [], False
            current.append(piece)
        if value[-1].isspace():
            words.append("".join(current))
            current, quoted = [], False

    def dollar(j: int, in_quotes: bool) -> int:
        if text.startswith("$(", j):
            end = _matching_parenthesis(text, j + 2)
            substitutions.append(text[j + 2:end])
            expand(SUBSTITUTION, in_quotes)
            return end + 1
        if text.startswith("${", j):
            end = text.find("}", j)
            if end < 0:
                raise IncompleteCommand("an unclosed ${")
            name = text[j + 2:end]
            expand(variables.get(name, "${" + name + "}"), in_quotes)
            return end + 1
        if name := _NAME.match(text, j + 1):
            expand(variables.get(name.group(), "$" + name.group()), in_quotes)
            return name.end()
        current.append("$")
        return j + 1

    while i < n:
        c = text[i]
        if c in " \t\n;|&()<>":
            break
        if c == "`":
            raise ValueError("a backquote: write $(...)")
        if c == "\\":
            if i + 1 >= n:
                raise IncompleteCommand("a trailing backslash")
            if text[i + 1] != "\n":
                current.append(text[i + 1])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise IncompleteCommand("an unclosed single quote")
            current.append(text[i + 1:end])
            quoted, i = True, end + 1
        elif c == '"':
            quoted, i = True, i + 1
            while True:
                if i >= n:
                    raise IncompleteCommand("an unclosed double quote")
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
                    if text[i + 1] != "\n":
                        current.append(text[i + 1])
                    i += 2
                elif c == "$":
                    i = dollar(i, True)
                elif c == "`":
                    raise ValueError("a backquote: write $(...)")
                else:
                    current.append(c)
                    i += 1
        elif c == "$":
            i = dollar(i, False)
        else:
            current.append(c)
            i += 1
    if current or quoted:
        words.append("".join(current))
    return words, i
