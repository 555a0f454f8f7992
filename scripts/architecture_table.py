"""Write the table of docs/ARCHITECTURE.md that says where each task type lives, from the code.

    python scripts/architecture_table.py           # (re)write the table in the file
    python scripts/architecture_table.py --check   # exit 1 when the table is out of date

A task type lives in a folder ``src/polyfuse/tasks/<folder>/``: the folder of the module
whose ``@register_task`` class declares ``name = "<type>"``. For each folder the table lists
its files and the modules outside ``tasks/`` that they import, by floor:
what the task reuses. Nothing is imported (the modules are parsed with :mod:`ast`), so the
script runs without torch.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "polyfuse"
TASKS = PACKAGE / "tasks"
TARGET = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- task-table:begin (scripts/architecture_table.py) -->", "<!-- task-table:end -->"
# the floors a task reuses, in the order the table lists them
FLOORS = ("nn", "metrics", "data", "extract", "figures", "functional")


def registered_names(path: Path) -> list[str]:
    """The ``name`` of every class of ``path`` decorated with ``register_task``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and any("register_task" in ast.unparse(d) for d in node.decorator_list):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and ast.unparse(statement.targets[0]) == "name"
                        and isinstance(statement.value, ast.Constant)):
                    names.append(statement.value.value)
    return names


def _as_path(dotted: str) -> str | None:
    """``polyfuse.nn.models.vqa`` -> ``nn/models/vqa.py``, a package -> ``nn/``; None if neither."""
    relative = Path(*dotted.split(".")[1:])
    if (PACKAGE / relative).with_suffix(".py").is_file():
        return f"{relative.as_posix()}.py"
    if (PACKAGE / relative / "__init__.py").is_file():
        return f"{relative.as_posix()}/"
    return None


def imported_modules(path: Path) -> set[str]:
    """The polyfuse modules ``path`` imports (module level or in functions), as paths
    relative to src/polyfuse (``nn/models/vqa.py``; ``nn/`` for a name of a package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("polyfuse."):
            for alias in node.names:  # from polyfuse.tasks import building: the module building
                found.add(_as_path(f"{node.module}.{alias.name}") or _as_path(node.module))
        elif isinstance(node, ast.Import):
            found |= {_as_path(alias.name) for alias in node.names if alias.name.startswith("polyfuse.")}
    return found - {None}


def folders() -> dict[str, list[str]]:
    """``{folder: [task types]}`` for every folder of tasks/ that registers a task type,
    and ``{folder: []}`` for a shared folder (one that registers none)."""
    result: dict[str, list[str]] = {}
    for folder in sorted(p for p in TASKS.iterdir() if (p / "__init__.py").is_file()):
        result[folder.name] = [n for path in sorted(folder.glob("*.py")) for n in registered_names(path)]
    return result


def folder_imports(folder: str) -> set[str]:
    """The modules the files of ``tasks/<folder>/`` import, outside the folder itself."""
    return {m for path in (TASKS / folder).glob("*.py") for m in imported_modules(path)
            if not m.startswith(f"tasks/{folder}/")}


def table() -> str:
    owners = folders()
    imports = {folder: folder_imports(folder) for folder in owners}
    rows = ["| task type | folder | its files | tasks/ modules it shares | what it reuses, by floor |",
            "|---|---|---|---|---|"]
    for folder, names in owners.items():
        listed = ", ".join(f"`{p.name}`" for p in sorted((TASKS / folder).glob("*.py")) if p.name != "__init__.py")
        shared = sorted(m.removeprefix("tasks/") for m in imports[folder] if m.startswith("tasks/"))
        reuse = "; ".join(", ".join(f"`{m}`" for m in sorted(m for m in imports[folder] if m.split("/")[0] == top))
                          for top in FLOORS if any(m.split("/")[0] == top for m in imports[folder]))
        if not names:  # a shared folder: the task types whose folders import it
            users = [n for other, ns in owners.items() for n in ns
                     if any(m.startswith(f"tasks/{folder}/") for m in imports[other])]
            names = [f"shared by {', '.join(users)}" if users else "shared"]
        rows.append(f"| {', '.join(names)} | `tasks/{folder}/` | {listed} "
                    f"| {', '.join(f'`{m}`' for m in shared) or '-'} | {reuse or '-'} |")
    return "\n".join(rows)


def updated(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{TARGET}: the markers {BEGIN} ... {END} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the table is out of date")
    args = parser.parse_args(argv)
    text = TARGET.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        if new != text:
            print(f"{TARGET} is out of date: run python scripts/architecture_table.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(new, encoding="utf-8")
    print(f"wrote the task table of {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
