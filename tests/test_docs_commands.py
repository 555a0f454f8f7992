"""Every command shown in README.md and docs/*.md runs as written after the README's
set-up, and there is one way to call the command line (docs/TESTING.md, "Commands in
the docs").

Each ``polyfuse ...`` command of a shell block is parsed by the real parser, without
being run; the repository files a command names must exist; the blocks marked ``run``
are executed in a fresh shell. Commands that need the shared data or train for minutes
are parsed and their paths checked, never run.
"""

import contextlib
import io
import re
import typing
from pathlib import Path

import pytest
from tests.doc_blocks import (
    ACTIVATE,
    ROOT,
    SHELL_LANGUAGES,
    Block,
    Command,
    KeyMention,
    code_blocks,
    commands,
    config_keys,
    doc_files,
    indented_code,
    run_block,
    shell_blocks,
    split_commands,
)

LANGUAGES = SHELL_LANGUAGES | {"text", "python", "yaml", "json"}
# Ways of calling the code that bypass the activated virtualenv: the docs say
# `polyfuse ...` and `python ...` (README.md, "Set-up").
FORBIDDEN = {
    "PYTHONPATH": (re.compile(r"\bPYTHONPATH="), "the editable install already imports src/"),
    "python -m polyfuse": (re.compile(r"\bpython3? -m polyfuse\.cli"), "call the polyfuse command"),
    ".venv/bin": (re.compile(r"\.venv/bin/(?!activate\b)"), "activate .venv (README, Set-up) and call it by name"),
}
# Repository paths a command may name; each must exist (a glob must match something).
REPOSITORY_PATH = re.compile(r"(?<![\w./-])(?:configs|scripts|tests|src)/[\w./*?+\[\]-]*[\w*\]]")


@pytest.fixture(scope="module")
def parser():
    from polyfuse.cli.main import build_parser

    return build_parser()


def _all_commands() -> list[Command]:
    return [command for block in shell_blocks() for command in commands(block)]


def _no_problems(problems: dict[tuple[str, str], list[str]]):
    """Fail with every problem found, one line each."""
    lines = [where for _, wheres in sorted(problems.items()) for where in wheres]
    assert not lines, "\n".join(lines)


def _forbidden_forms(path: Path, text: str) -> dict[tuple[str, str], list[str]]:
    problems = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for rule, (pattern, advice) in FORBIDDEN.items():
            if pattern.search(line):
                problems.setdefault((str(path), rule), []).append(f"{path}:{number}: {rule}: {advice}")
    return problems


def _parse_failures(parser, found: list[Command]) -> tuple[list[str], int]:
    """argparse's error for each polyfuse command it refuses, and how many it read."""
    failures, parsed = [], 0
    for command in found:
        argv = command.argv
        if argv[:1] != ("polyfuse",):
            continue
        parsed += 1
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                parser.parse_args(list(argv[1:]))
            except SystemExit as stop:
                if stop.code:  # --help exits 0
                    message = (stderr.getvalue().strip().splitlines() or [f"exit {stop.code}"])[-1]
                    failures.append(f"{command.where}: {command.text.strip()}\n    {message}")
    return failures, parsed


def _missing_paths(found: list[Command], root: Path = ROOT) -> list[str]:
    missing = []
    for command in found:
        for word in [*command.words, *command.env.values()]:
            for path in REPOSITORY_PATH.findall(word.split("::")[0]):
                if not any(root.glob(path)) and not (root / path).exists():
                    missing.append(f"{command.where}: {path} does not exist (in: {command.text.strip()})")
        argv = command.argv
        if argv[:1] == ("python",) and len(argv) > 1 and argv[1].endswith(".py") and not argv[1].startswith("scripts/"):
            missing.append(f"{command.where}: {argv[1]} is not a script of scripts/")
    return missing


def test_every_code_block_is_fenced_with_its_language():
    """An indented block has no language, so no reader (nor this test) can tell a
    command from its output: every block is fenced, with one of LANGUAGES."""
    problems = {}
    for path in doc_files():
        key, indented = str(path), indented_code(path)
        for line in indented:
            if line - 1 not in indented:
                problems.setdefault((key, "indented code"), []).append(f"{path}:{line}: indented code: fence it")
        for block in code_blocks(path):
            if block.language not in LANGUAGES:
                problems.setdefault((key, f"language {block.language!r}"), []).append(
                    f"{block.where}: language {block.language!r}: fence it as one of {sorted(LANGUAGES)}"
                )
            if block.flags and (block.language not in SHELL_LANGUAGES or set(block.flags) != {"run"}):
                problems.setdefault((key, "flags"), []).append(f"{block.where}: only a shell block takes 'run'")
    _no_problems(problems)


def test_one_way_to_call_the_command_line():
    """Prose included: no `PYTHONPATH=`, `python -m polyfuse` or `.venv/bin/` (but
    the activation line); after the README's set-up it is `polyfuse ...` and `python ...`."""
    problems = {}
    for path in doc_files():
        problems.update(_forbidden_forms(path, (ROOT / path).read_text()))
    _no_problems(problems)


def test_every_polyfuse_command_parses(parser):
    """argparse reads each documented polyfuse command as written (nothing is run)."""
    failures, parsed = _parse_failures(parser, _all_commands())
    assert not failures, "\n".join(failures)
    assert parsed > 100  # the docs show about 110: fewer means the reader lost some


def test_repository_paths_named_by_commands_exist():
    """configs/..., scripts/..., tests/... and src/... in a command (a `--config`,
    `python scripts/X.py`, a pytest node) are files of the repository."""
    missing = _missing_paths(_all_commands())
    assert not missing, "\n".join(missing)


def test_the_readme_set_up_activates_the_virtualenv_and_every_doc_says_so():
    readme = (ROOT / "README.md").read_text()
    assert "\n## Set-up\n" in readme, "README.md#set-up, which the docs link, is the heading '## Set-up'"
    set_up = readme.split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]
    assert ACTIVATE in set_up, f"README's set-up must show `{ACTIVATE}`, which every doc assumes"
    assert any(ACTIVATE in b.script() for b in shell_blocks() if b.path == Path("README.md"))
    problems = {}
    for path in doc_files()[1:]:
        shows = [b for b in code_blocks(path) if b.language in SHELL_LANGUAGES or "polyfuse " in "\n".join(b.lines)]
        if shows and "(../README.md#set-up)" not in (ROOT / path).read_text():
            problems[(str(path), "no set-up link")] = [
                f"{shows[0].where}: shows commands but does not link ../README.md#set-up, which activates .venv"
            ]
    _no_problems(problems)


# Configuration keys named in the docs.


def _field_model(annotation):
    """The pydantic model an annotation holds (``Section | None`` included), or None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        if (model := _field_model(argument)) is not None:
            return model
    return None


def _is_mapping(annotation) -> bool:
    """A ``dict[...]`` (``dict[...] | None`` included): its keys are values, not config keys."""
    return typing.get_origin(annotation) is dict or any(_is_mapping(a) for a in typing.get_args(annotation))


def _key_problem(key: tuple[str, ...]) -> str | None:
    """Why ``key`` is not a key of the run configuration, or None when it is.

    Walks polyfuse.engine.schema.RunConfig's nested sections (the task types' included);
    ``model.options.<fusion>.<keyword>`` is checked against
    ``fusion_option_model(<fusion>)`` (a backbone's options: its name only); below a
    mapping (``retrieval.experts``, ``task.target_ranges``) any name is a value."""
    import polyfuse.nn
    import polyfuse.nn.backbones
    from polyfuse.engine.schema import RunConfig, fusion_option_model

    model = RunConfig
    for depth, part in enumerate(key):
        if key[:depth] == ("model", "options"):
            if part in polyfuse.nn.backbones.available():
                return None
            if part not in polyfuse.nn.available():
                return f"model.options.{part}: no fusion module {part!r}"
            if len(key) > depth + 1 and key[depth + 1] not in fusion_option_model(part).model_fields:
                return f"the fusion {part} takes no option {key[depth + 1]!r}"
            return None
        if part not in model.model_fields:
            return f"no key {part!r} under {'.'.join(key[:depth]) or 'the top level'}"
        annotation = model.model_fields[part].annotation
        if (inner := _field_model(annotation)) is not None:
            model = inner
        elif _is_mapping(annotation):
            if key[:depth + 1] != ("model", "options"):
                return None
        elif depth + 1 < len(key):
            return f"{'.'.join(key[:depth + 1])} is a value, not a section"
    return None


def _wrong_keys(mentions: list[KeyMention]) -> list[str]:
    return [f"{m.where}: {m.name} ({m.how}): {problem}" for m in mentions if (problem := _key_problem(m.key))]


def _sections() -> list[str]:
    from polyfuse.engine.schema import RunConfig

    return list(RunConfig.model_fields)


def test_every_configuration_key_named_in_the_docs_exists():
    """A key the docs name (`data.vqa.min_answer_count` in inline code, the keys of a
    ```yaml block that is a configuration, `--set KEY=VALUE` in a command) is a key of
    polyfuse.engine.schema.RunConfig; `model.options.<fusion>.<keyword>` a keyword of
    the fusion's constructor. A key that the code has renamed or dropped fails here."""
    mentions = config_keys(_sections())
    assert len({m.name for m in mentions}) > 150  # the docs name about 250: fewer means the reader lost some
    wrong = _wrong_keys(mentions)
    assert not wrong, "\n".join(wrong)


def test_the_key_check_catches_what_it_is_for(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "Set `data.vqa.min_answer_count: 9`, `optim.schedular` and `model.options.man.estimator`;\n"
        "not `model.options.man.estimater`, `trainer.max_epochs.x` nor `model.options.nope.k`.\n"
        "Not keys: `data.json`, `polyfuse.data.vqa`, `self.model.fusion`, `task.allow_unknown = True`,\n"
        "`task.model.encode(x)`; a placeholder keeps its head: `model.options.<fusion>`.\n"
    )
    (tmp_path / "docs" / "x.md").write_text(
        "```yaml\ntask:\n  type: sentiment\n  target_ranges: {humour: [0, 1]}\ntrainer: {max_epoch: 3}\n```\n\n"
        "```yaml\njobs: {test: {steps: [1]}}\n```\n\n"  # not a run configuration
        "```console\n$ polyfuse train --set trainer.max_epoch=3 --set optim.lr=1\n"
        "polyfuse train: error: unknown config key 'trainer.max_epoch'\n```\n\n"
        "```bash\npolyfuse train --set trainer.patiense=2\n```\n"
    )
    mentions = config_keys(_sections(), root=tmp_path)
    assert [(m.how, m.name) for m in mentions] == [
        ("prose", "data.vqa.min_answer_count"), ("prose", "optim.schedular"), ("prose", "model.options.man.estimator"),
        ("prose", "model.options.man.estimater"), ("prose", "trainer.max_epochs.x"), ("prose", "model.options.nope.k"),
        ("prose", "model.options"),
        ("yaml", "task"), ("yaml", "task.type"), ("yaml", "task.target_ranges"), ("yaml", "task.target_ranges.humour"),
        ("yaml", "trainer"), ("yaml", "trainer.max_epoch"),
        ("--set", "optim.lr"), ("--set", "trainer.patiense"),
    ]
    assert [w.split(": ", 1)[1] for w in _wrong_keys(mentions)] == [
        "optim.schedular (prose): no key 'schedular' under optim",
        "model.options.man.estimater (prose): the fusion man takes no option 'estimater'",
        "trainer.max_epochs.x (prose): trainer.max_epochs is a value, not a section",
        "model.options.nope.k (prose): model.options.nope: no fusion module 'nope'",
        "trainer.max_epoch (yaml): no key 'max_epoch' under trainer",
        "trainer.patiense (--set): no key 'patiense' under trainer",
    ]


def _run_blocks() -> list[Block]:
    return [block for block in shell_blocks() if block.runs]


def test_some_blocks_are_executed():
    assert len(_run_blocks()) >= 3
    assert any(block.language == "console" for block in _run_blocks())


def _check_run(block: Block, home: Path):
    done = run_block(block, home)
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{block.script()}\n{done.stderr[-2000:]}"
    if block.language == "console":
        shown = [line.rstrip() for _, line in block.output_lines()]
        printed = [line.rstrip() for line in done.stdout.splitlines()]
        assert printed == shown, f"{block.where} prints\n" + "\n".join(printed)


@pytest.mark.parametrize("block", _run_blocks(), ids=lambda block: block.where)
def test_marked_blocks_run_after_the_set_up(block, tmp_path):
    """A block marked ``run`` runs in a fresh bash (``set -euo pipefail``) from the
    repository root after the README's activation line; a console block prints the
    output it shows."""
    assert (ROOT / ".venv" / "bin" / "activate").is_file(), "no .venv: run `make install` first"
    _check_run(block, tmp_path)


# The checks fail where they should.


def test_the_checks_catch_what_they_are_for(parser, tmp_path):
    found = split_commands(
        "polyfuse train --confg configs/mosi/man.yaml\n"
        "polyfuse train --config configs/mosi/nope.yaml\n"
        "polyfuse compare --config configs/mosi/man.yaml --models ban,configs/easy_vqa/nope.yaml\n"
        "python scripts/nope.py\npython tools/x.py\n"
        "polyfuse --help\n"
    )
    failures, parsed = _parse_failures(parser, found)
    assert parsed == 4 and len(failures) == 1 and "unrecognized arguments: --confg" in failures[0]
    missing = _missing_paths(found)
    assert [m.split(":")[1] for m in missing] == ["2", "3", "4", "5"], missing
    forbidden = _forbidden_forms(Path("x.md"), (
        "PYTHONPATH=src python -m polyfuse.cli.main train\n"
        ". .venv/bin/activate\n"
        "`.venv/bin/polyfuse demo`\n"
    ))
    assert sorted(forbidden) == [("x.md", rule) for rule in (".venv/bin", "PYTHONPATH", "python -m polyfuse")]
    assert forbidden[("x.md", ".venv/bin")] == ["x.md:3: .venv/bin: " + FORBIDDEN[".venv/bin"][1]]
    with pytest.raises(AssertionError, match="prints"):
        _check_run(Block(Path("x.md"), 1, "console", ("run",), ("$ echo shown", "other")), tmp_path)
    with pytest.raises(AssertionError, match="exit 1"):
        _check_run(Block(Path("x.md"), 1, "bash", ("run",), ("false", "echo not reached")), tmp_path)
    # the fresh shell has the venv's python, not the caller's
    _check_run(Block(Path("x.md"), 1, "console", ("run",), (
        '$ python -c "import sys; print(sys.prefix.endswith(\'.venv\'))"', "True",
    )), tmp_path)


# The reader, on the forms the docs use.


def test_a_block_splits_into_commands_as_bash_would():
    script = (
        'S="--set trainer.num_threads=1 --quiet"   # shared options\n'
        "for s in 0 1 2; do\n"
        "  OMP_NUM_THREADS=1 polyfuse train --config configs/mosi/man.yaml \\\n"
        '      --set seed=$s $S --out "runs/a b/$s" > log.txt 2>&1 &\n'
        "done; wait\n"
        "IMAGES=$(python -c \"import os; print('x')\")/data && ls '$IMAGES' | head -1\n"
        "polyfuse compare --models ban,\\\nconfigs/easy_vqa/ban_nocount.yaml\n"
    )
    found = split_commands(script)
    assert [c.line for c in found] == [1, 3, 5, 6, 6, 6, 6, 7]
    assert found[0].words == () and found[0].env == {"S": "--set trainer.num_threads=1 --quiet"}
    assert found[1].env == {"OMP_NUM_THREADS": "1"}
    assert found[1].words == ("polyfuse", "train", "--config", "configs/mosi/man.yaml", "--set", "seed=0",
                              "--set", "trainer.num_threads=1", "--quiet", "--out", "runs/a b/0")
    assert found[1].text.startswith("  OMP_NUM_THREADS=1 polyfuse") and "--out" in found[1].text
    assert found[2].words == ("wait",)
    assert found[3].words == ("python", "-c", "import os; print('x')") and found[3].in_substitution
    assert found[4].env == {"IMAGES": "$(...)/data"}
    assert found[5].words == ("ls", "$IMAGES") and found[6].words == ("head", "-1")
    assert found[7].words == ("polyfuse", "compare", "--models", "ban,configs/easy_vqa/ban_nocount.yaml")


def test_wrappers_are_stripped_from_argv():
    (command,) = split_commands("timeout -s INT 9 nice -n 10 polyfuse train --resume runs/x")
    assert command.argv == ("polyfuse", "train", "--resume", "runs/x")


def test_a_console_block_keeps_commands_and_output_apart():
    block = Block(Path("x.md"), 10, "console", ("run",), (
        "$ polyfuse train --config configs/synthetic/planted.yaml \\",
        "    --quiet",
        "run directory: runs/planted-man",
        "$ echo 'two",
        "lines'",
        "two",
        "lines",
    ))
    assert [c.line for c in commands(block)] == [11, 14]
    assert commands(block)[0].words[-1] == "--quiet"
    assert [n for n, _ in block.output_lines()] == [13, 16, 17]
    assert block.script() == "polyfuse train --config configs/synthetic/planted.yaml \\\n    --quiet\necho 'two\nlines'\n"


def test_fences_and_indented_code_are_found_as_markdown_reads_them():
    """The reader agrees with a CommonMark parser on every doc: the same fenced blocks
    at the same lines, and the same lines of indented code."""
    import markdown_it
    parser = markdown_it.MarkdownIt("commonmark")
    for path in doc_files():
        text = (ROOT / path).read_text()
        tokens, lines = parser.parse(text), text.splitlines()
        assert [b.line for b in code_blocks(path)] == [t.map[0] + 1 for t in tokens if t.type == "fence"], path
        code = sorted(k + 1 for t in tokens if t.type == "code_block" for k in range(*t.map) if lines[k].strip())
        assert indented_code(path) == code, path
