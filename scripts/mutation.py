#!/usr/bin/env python
"""Mutation testing of one module at a time with mutmut (see docs/TESTING.md).

    python scripts/mutation.py polyfuse.nn.man [polyfuse.functional.bilinear ...]
        [--jobs 1] [--workdir build/mutation] [--show-survivors] [--only GLOB ...]

For each module, a scratch copy of ``src/``, ``tests/`` and ``pyproject.toml`` is made
under ``--workdir/<module>/`` with ``[tool.mutmut]`` narrowed to that module's file and
to the test files that ``[tool.polyfuse.mutation.tests]`` of pyproject.toml lists for it
(mutmut then runs, for each mutant, only the tests that reach the mutated function).
The scratch copy keeps mutmut's cache, so a second run only retests what changed.
At the end one line per module: mutants, killed, survived, other outcomes and the score
killed / (killed + survived); ``--show-survivors`` prints each survivor's diff.
``--only`` restricts the run to the mutants whose names match a glob (mutmut's names:
``polyfuse.nn.man.xǁMANǁ_fuse__mutmut_*`` for a method, ``polyfuse.functional.bilinear.
x_bilinear_attention_logits__mutmut_*`` for a function); the counts are then over those.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def read_settings() -> tuple[dict, dict[str, list[str]]]:
    """The [tool.mutmut] table and the module -> test files map of pyproject.toml."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    mutmut = data["tool"]["mutmut"]
    tests = data["tool"]["polyfuse"]["mutation"]["tests"]
    return mutmut, tests


def module_file(module: str) -> Path:
    path = Path("src", *module.split(".")).with_suffix(".py")
    if not (ROOT / path).is_file():
        raise SystemExit(f"mutation: module {module!r} has no file {path}")
    return path


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def prepare(module: str, workdir: Path, mutmut: dict, tests: list[str]) -> Path:
    """Copy the sources and tests to workdir/module and narrow [tool.mutmut] to them."""
    target = workdir / module
    target.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests"):
        if (target / name).exists():
            shutil.rmtree(target / name)
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    settings = dict(mutmut)
    settings["only_mutate"] = [module_file(module).as_posix()]
    settings["pytest_add_cli_args_test_selection"] = tests
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    head, _, _ = pyproject.partition("[tool.mutmut]")
    lines = ["[tool.mutmut]"]
    for key, value in settings.items():
        lines.append(f"{key} = {toml_list(value) if isinstance(value, list) else json.dumps(value)}")
    (target / "pyproject.toml").write_text(head + "\n".join(lines) + "\n", "utf-8")
    return target


def exit_codes(target: Path, module: str, only: list[str]) -> dict[str, int | None]:
    """mutmut's exit code of each mutant of the module (None: not tested yet)."""
    meta = target / "mutants" / module_file(module).with_suffix(".py.meta")
    if not meta.is_file():
        return {}
    codes = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
    return {k: v for k, v in codes.items() if not only or any(fnmatch(k, glob) for glob in only)}


def outcomes(target: Path, module: str, only: list[str]) -> Counter:
    from mutmut.stats import status_by_exit_code

    return Counter(status_by_exit_code[code] for code in exit_codes(target, module, only).values())


def survivors(target: Path, module: str, only: list[str]) -> list[str]:
    from mutmut.stats import status_by_exit_code

    codes = exit_codes(target, module, only)
    return sorted(name for name, code in codes.items() if status_by_exit_code[code] == "survived")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="dotted module names (default: every module of the map)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested in parallel (default 1)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutation")
    parser.add_argument("--show-survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--only", nargs="+", default=[], metavar="GLOB", help="mutant name globs to run")
    args = parser.parse_args(argv)
    mutmut, test_map = read_settings()
    modules = args.modules or sorted(test_map)
    unknown = [m for m in modules if m not in test_map]
    if unknown:
        raise SystemExit(
            f"mutation: no test files listed for {', '.join(unknown)} in "
            "[tool.polyfuse.mutation.tests] of pyproject.toml"
        )
    rows = []
    for module in modules:
        target = prepare(module, args.workdir.resolve(), mutmut, test_map[module])
        run = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs), *args.only]
        # One torch thread per forked mutant: a forked child can hang in the parent's
        # thread pool and count as a (false) timeout.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        status = subprocess.run(run, cwd=target, stdout=subprocess.DEVNULL, env=env).returncode
        if status:
            print(f"mutation: mutmut failed on {module} (exit {status}); rerun in {target}", file=sys.stderr)
        counts = outcomes(target, module, args.only)
        killed, survived = counts["killed"] + counts["timeout"], counts["survived"]
        score = killed / (killed + survived) if killed + survived else float("nan")
        other = {k: v for k, v in counts.items() if k not in ("killed", "timeout", "survived")}
        rows.append((module, sum(counts.values()), killed, survived, other, score))
        if args.show_survivors:
            for name in survivors(target, module, args.only):
                subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=target)
    print(f"{'module':36} {'mutants':>7} {'killed':>7} {'survived':>8} {'score':>6}  other")
    for module, total, killed, survived, other, score in rows:
        extra = ", ".join(f"{k}: {v}" for k, v in sorted(other.items())) or "-"
        print(f"{module:36} {total:7d} {killed:7d} {survived:8d} {score:6.1%}  {extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
