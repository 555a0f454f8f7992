"""The import graph of ``src/polyfuse`` keeps the floors of docs/ARCHITECTURE.md.

Every module is parsed with :mod:`ast` (nothing is imported, so the test costs a
fraction of a second); every ``import`` counts, at module level and inside functions,
because a function-local import is a dependency all the same (it only hides a cycle
until the function runs). The rules:

    a  no import cycle between modules
    b  no edge from a floor to a floor above it (the floors are :data:`FLOORS`)
    c  data/ and metrics/ do not import each other (they share a floor; what both
       need belongs a floor down)
    d  no private name (``_x``) imported from another file
    e  nothing pickled: no ``weights_only=False``, no ``import pickle``
    f  no branch on a task's name outside src/polyfuse/tasks/ (a comparison or a
       ``match`` against a string equal to a registered task type)
    g  bench/ uses the engine's public API only: the names ``polyfuse.engine`` exports
       (``from polyfuse.engine import train``), never a module of engine/
    h  figures in one place: matplotlib is imported in figures/ only
    i  a task type's folder (tasks/<type>/, one that registers a task type) imports no
       other task type's folder; what two share is a shared module of tasks/ (tasks/ranking/)

:data:`KNOWN_VIOLATIONS` lists the ``(file, rule)`` pairs that exist today and are
being removed; the test allows them and fails once one of them is gone, so the list
only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "polyfuse"

# Floor of each top-level folder; a higher number is a higher floor. A module may import
# its own floor and the floors below it (rule b); data/ and metrics/ share a floor.
FLOORS: dict[str, int] = {
    "cli": 10,
    "bench": 9,
    "engine": 8,
    "tasks": 7,
    # figures/ sits below the floors that draw (engine, bench, and a task spec's
    # attention figures and comparison figure) and above those that never draw (nn/ owns
    # parameters, data/ and metrics/ read and score). It draws arrays and never loads a
    # run or a model, so it imports less than its floor allows: FIGURES_MAY_IMPORT.
    "figures": 6,
    "nn": 5,
    # extract/ writes feature files with data/'s readers and writers (open_h5): a floor
    # above data/; nothing below tasks/ reads through it.
    "extract": 4,
    "data": 3,
    "metrics": 3,
    "functional": 2,
    "ground": 1,
}

# What each top-level file of src/polyfuse is, and why. A new top-level file fails
# the test until it is placed here.
TOP_LEVEL: dict[str, str] = {
    # the package's face: it imports nothing of polyfuse by name (functional and nn
    # are loaded lazily by PEP 562 __getattr__), so anything may import __version__.
    "__init__": "ground",
    # input validation, float precision policy, tokenising: torch only, used everywhere.
    "_checks": "ground",
    "_precision": "ground",
    "text": "ground",
    # atomic file writes and the size bounds of a configuration: the standard library
    # (and pydantic's Field), used by data/, tasks/ and engine/ alike.
    "atomic": "ground",
    "sizes": "ground",
    "seeds": "ground",
    # progress bars on a terminal and the final line of a long step: tqdm and the
    # standard library, used by extract/, data/ and tasks/.
    "progress": "ground",
    # converts other libraries' BAN checkpoints into nn modules: a user of nn/, as a
    # task is, and nothing below imports it.
    "interop": "tasks",
    # the synthetic demo trains nn modules on data/synthetic: a user of nn/ and data/;
    # only cli/demo.py imports it.
    "demo": "tasks",
}

# figures/ draws; it reads nothing of runs, models or tasks.
FIGURES_MAY_IMPORT = {"figures", "data", "metrics", "functional", "ground"}

RULES = {
    "a": "import cycle",
    "b": "upward import between floors",
    "c": "data/ and metrics/ import each other",
    "d": "private name imported from another file",
    "e": "pickle",
    "f": "branch on a task's name outside tasks/",
    "g": "bench/ reaches below the engine's public API",
    "h": "matplotlib outside figures/",
    "i": "one task type's folder imports another's",
}

# Task types that may not be compared against outside tasks/ (rule f); the names that
# tasks/ registers (``name = "..."`` in a @register_task class, or TASKS["..."]) are added.
TASK_NAMES = {"sentiment", "traits", "classification", "vqa", "captioning", "retrieval", "chimera"}

# (file relative to src/polyfuse, rule): violations that exist today and are being
# removed on other branches of issue 25. Remove an entry when its violation is gone.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Violation:
    file: str  # relative to src/polyfuse
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"src/polyfuse/{self.file}:{self.line}: rule {self.rule} ({RULES[self.rule]}): {self.detail}"


@dataclass(frozen=True)
class Edge:
    source: str  # dotted module names
    target: str
    line: int
    names: tuple[str, ...]  # the names of a ``from ... import``; () for ``import x``


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _parse_all() -> dict[str, tuple[Path, ast.Module]]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        modules[_module_name(path)] = (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return modules


MODULES = _parse_all()


def _index(node: ast.AST, by_type: dict[type, list[ast.AST]]) -> None:
    """Every node under ``node``, by type (ast.walk, three times faster: one walk of all
    modules, after parsing, is most of what this test costs)."""
    by_type.setdefault(type(node), []).append(node)
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    _index(item, by_type)
        elif isinstance(value, ast.AST):
            _index(value, by_type)


NODES: dict[str, dict[type, list[ast.AST]]] = {name: {} for name in MODULES}
for _name, (_, _tree) in MODULES.items():
    _index(_tree, NODES[_name])


def _nodes(module: str, *types: type) -> list:
    """The nodes of ``module`` of the given types."""
    return [node for kind in types for node in NODES[module].get(kind, [])]


def _relpath(module: str) -> str:
    return str(MODULES[module][0].relative_to(PACKAGE))


def _is_package(module: str) -> bool:
    return MODULES[module][0].name == "__init__.py"


def _floor_key(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "ground"  # polyfuse itself
    top = parts[1]
    if (PACKAGE / top).is_dir():
        return top
    return TOP_LEVEL[top]


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges(module: str, nodes: Iterable[ast.AST]) -> Iterator[Edge]:
    """Every import of a polyfuse module among the ``nodes`` of ``module`` (all of them,
    module level or function local)."""
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "polyfuse" or alias.name.startswith("polyfuse."):
                    yield Edge(module, alias.name if alias.name in MODULES else "", node.lineno, ())
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, node)
            if base != "polyfuse" and not base.startswith("polyfuse."):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                if child in MODULES:  # from polyfuse.engine import run: the module run
                    yield Edge(module, child, node.lineno, ())
                else:
                    yield Edge(module, base if base in MODULES else "", node.lineno, (alias.name,))


ALL_EDGES = [edge for module in MODULES for edge in _edges(module, _nodes(module, ast.Import, ast.ImportFrom))]
EDGES = [edge for edge in ALL_EDGES if edge.target]  # those that name no module fail their own test


def _cycles() -> Iterator[Violation]:
    """Rule a: every edge inside a strongly connected component (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in EDGES:
        graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    for component in components:
        if len(component) == 1 and not any(e.source == e.target for e in EDGES if e.source in component):
            continue
        members = " <-> ".join(sorted(component))
        for edge in EDGES:
            if edge.source in component and edge.target in component:
                yield Violation(_relpath(edge.source), edge.line, "a",
                                f"{edge.source} imports {edge.target}; cycle among {members}")


def _floors() -> Iterator[Violation]:
    """Rules b and c."""
    for edge in EDGES:
        source, target = _floor_key(edge.source), _floor_key(edge.target)
        where = _relpath(edge.source)
        if {source, target} == {"data", "metrics"}:
            yield Violation(where, edge.line, "c", f"{edge.source} imports {edge.target}")
        elif source == "figures" and target not in FIGURES_MAY_IMPORT:
            yield Violation(where, edge.line, "b", f"figures/ imports {edge.target} ({target}/ is not drawing)")
        elif FLOORS[target] > FLOORS[source]:
            yield Violation(where, edge.line, "b",
                            f"{edge.source} ({source}, floor {FLOORS[source]}) imports "
                            f"{edge.target} ({target}, floor {FLOORS[target]})")


def _private_names() -> Iterator[Violation]:
    """Rule d: ``from other import _x`` and ``other._x`` on an imported polyfuse module."""
    for edge in EDGES:
        if edge.source == edge.target:
            continue
        for name in edge.names:
            if name.startswith("_") and not name.startswith("__"):
                yield Violation(_relpath(edge.source), edge.line, "d",
                                f"{edge.source} imports {name} from {edge.target}")
    for module in MODULES:
        aliases = {}  # local name -> polyfuse module, for ``import polyfuse.x as y``
        for node in _nodes(module, ast.Import, ast.ImportFrom):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("polyfuse.") and alias.asname:
                        aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(module, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in MODULES:
                        aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in _nodes(module, ast.Attribute):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and aliases[node.value.id] != module
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                yield Violation(_relpath(module), node.lineno, "d",
                                f"{module} uses {aliases[node.value.id]}.{node.attr}")


def _pickles() -> Iterator[Violation]:
    """Rule e."""
    for module in MODULES:
        for node in _nodes(module, ast.Import, ast.ImportFrom, ast.keyword):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in {"pickle", "cPickle", "dill"} for a in node.names):
                yield Violation(_relpath(module), node.lineno, "e", "imports pickle")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {"pickle", "dill"}:
                yield Violation(_relpath(module), node.lineno, "e", "imports from pickle")
            elif isinstance(node, ast.keyword) and node.arg == "weights_only" and not (
                    isinstance(node.value, ast.Constant) and node.value.value is True):
                yield Violation(_relpath(module), node.value.lineno, "e",
                                f"weights_only={ast.unparse(node.value)} (torch.load unpickles)")


def _registered_task_names() -> set[str]:
    """TASK_NAMES and every name tasks/ registers (``name = "..."`` in a class decorated
    with ``register_task``; ``TASKS["..."] = ...``)."""
    names = set(TASK_NAMES)
    for module in MODULES:
        if not module.startswith("polyfuse.tasks"):
            continue
        for node in _nodes(module, ast.ClassDef, ast.Subscript):
            if isinstance(node, ast.ClassDef) and any(
                    "register_task" in ast.unparse(d) for d in node.decorator_list):
                for stmt in node.body:
                    target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
                    value = getattr(stmt, "value", None)
                    if (isinstance(target, ast.Name) and target.id == "name"
                            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        names.add(value.value)
            elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
                  and ast.unparse(node.value) == "TASKS" and isinstance(node.slice, ast.Constant)):
                names.add(node.slice.value)
    return names


def _task_constants(node: ast.AST, names: set[str], aliases: dict[str, str]) -> list[str]:
    """The task names among the string constants of a compared expression: a constant,
    a module-level name bound to one (``VQA = "vqa"``, in ``aliases``), or a literal
    tuple, list or set of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in names else []
    if isinstance(node, ast.Name) and node.id in aliases:
        return [aliases[node.id]]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for element in node.elts for n in _task_constants(element, names, aliases)]
    return []


def _task_name_aliases(module: str, names: set[str]) -> dict[str, str]:
    """Module-level names bound to a task name (``VQA = "vqa"``)."""
    aliases = {}
    for stmt in MODULES[module][1].body:
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                and stmt.value.value in names):
            aliases |= {t.id: stmt.value.value for t in stmt.targets if isinstance(t, ast.Name)}
    return aliases


def _task_branches() -> Iterator[Violation]:
    """Rule f outside tasks/: ``x == "vqa"``, ``x in ("vqa", ...)``, ``case "vqa":``, the
    same with a module constant ``VQA = "vqa"``, and a dispatch table indexed in place
    (``{"vqa": ..., ...}[x]``, ``{"vqa": ...}.get(x)``)."""
    names = _registered_task_names()
    comparisons = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
    for module in MODULES:
        if module == "polyfuse.tasks" or module.startswith("polyfuse.tasks."):
            continue
        aliases = _task_name_aliases(module, names)
        for node in _nodes(module, ast.Compare, ast.MatchValue, ast.Subscript, ast.Call):
            found: list[str] = []
            if isinstance(node, ast.Compare) and any(isinstance(op, comparisons) for op in node.ops):
                for operand in [node.left, *node.comparators]:
                    found += _task_constants(operand, names, aliases)
            elif isinstance(node, ast.MatchValue):
                found = _task_constants(node.value, names, aliases)
            elif isinstance(node, (ast.Subscript, ast.Call)):
                table = node.value if isinstance(node, ast.Subscript) else (
                    node.func.value if isinstance(node.func, ast.Attribute) and node.func.attr == "get" else None)
                if isinstance(table, ast.Dict):
                    found = [n for key in table.keys if key is not None for n in _task_constants(key, names, aliases)]
            if found:
                yield Violation(_relpath(module), node.lineno, "f",
                                f"branches on task name(s) {sorted(set(found))}: {ast.unparse(node)[:80]}")


def _engine_exports() -> set[str]:
    """The keys of ``_EXPORTS`` in engine/__init__.py: the engine's public names."""
    for node in _nodes("polyfuse.engine", ast.Assign):
        if ast.unparse(node.targets[0]) == "_EXPORTS" and isinstance(node.value, ast.Dict):
            return {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    raise AssertionError("engine/__init__.py defines no _EXPORTS dict")


def _bench_on_public_engine() -> Iterator[Violation]:
    """Rule g."""
    exports = _engine_exports()
    for edge in EDGES:
        if _floor_key(edge.source) != "bench" or _floor_key(edge.target) != "engine":
            continue
        outside = [name for name in edge.names if name not in exports]
        if edge.target != "polyfuse.engine" or outside:
            what = ", ".join(outside) if edge.target == "polyfuse.engine" else edge.target
            yield Violation(_relpath(edge.source), edge.line, "g",
                            f"{edge.source} imports {what}, not an export of polyfuse.engine")


def _matplotlib() -> Iterator[Violation]:
    """Rule h."""
    for module in MODULES:
        if _floor_key(module) == "figures":
            continue
        for node in _nodes(module, ast.Import, ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(name.split(".")[0] == "matplotlib" for name in names):
                yield Violation(_relpath(module), node.lineno, "h", "imports matplotlib; draw in polyfuse.figures")


def _task_folder(module: str) -> str | None:
    """``vqa`` for ``polyfuse.tasks.vqa.spec``; None outside the folders of tasks/."""
    parts = module.split(".")
    if len(parts) >= 4 and parts[1] == "tasks" and (PACKAGE / "tasks" / parts[2]).is_dir():
        return parts[2]
    return None


def _task_type_folders() -> set[str]:
    """The folders of tasks/ with a module that registers a task type."""
    return {folder for module in MODULES if (folder := _task_folder(module))
            and any(isinstance(node, ast.ClassDef) and any("register_task" in ast.unparse(d) for d in node.decorator_list)
                    for node in _nodes(module, ast.ClassDef))}


def _task_folders_apart() -> Iterator[Violation]:
    """Rule i."""
    owners = _task_type_folders()
    for edge in EDGES:
        source, target = _task_folder(edge.source), _task_folder(edge.target)
        if source and target and source != target and target in owners:
            yield Violation(_relpath(edge.source), edge.line, "i", f"{edge.source} imports {edge.target}")


def _violations() -> list[Violation]:
    found = {*_cycles(), *_floors(), *_private_names(), *_pickles(), *_task_branches(), *_bench_on_public_engine(),
             *_matplotlib(), *_task_folders_apart()}
    return sorted(found, key=lambda v: (v.file, v.line, v.rule, v.detail))


VIOLATIONS = _violations()


def test_every_top_level_file_has_a_floor():
    unplaced = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in TOP_LEVEL)
    assert not unplaced, f"place these top-level files of src/polyfuse in TOP_LEVEL: {unplaced}"
    unknown = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                     and p.name not in FLOORS)
    assert not unknown, f"give these packages of src/polyfuse a floor in FLOORS: {unknown}"


def test_every_import_resolves_to_a_module():
    unresolved = [f"src/polyfuse/{_relpath(e.source)}:{e.line}" for e in ALL_EDGES if not e.target]
    assert not unresolved, "imports of polyfuse that name no module: " + "; ".join(unresolved)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_no_new_violation(rule):
    new = [str(v) for v in VIOLATIONS if v.rule == rule and (v.file, v.rule) not in KNOWN_VIOLATIONS]
    if new:
        pytest.fail(f"{len(new)} new violation(s) of rule {rule} ({RULES[rule]}):\n" + "\n".join(new), pytrace=False)


def test_known_violations_still_exist():
    """The list only shrinks: a fixed violation must leave KNOWN_VIOLATIONS."""
    present = {(v.file, v.rule) for v in VIOLATIONS}
    fixed = sorted(KNOWN_VIOLATIONS - present)
    assert not fixed, f"fixed, remove from KNOWN_VIOLATIONS in tests/test_layers.py: {fixed}"


# -- the checker itself, on code written to break each rule ----------------------------

def test_checker_sees_function_local_and_relative_imports():
    source = "def f():\n    from .run import train\n    import polyfuse.cli.main\n    from polyfuse.nope import x\n"
    tree = ast.parse(source)
    edges = list(_edges("polyfuse.engine.learning_curves", ast.walk(tree)))
    assert sorted((e.target, e.line, e.names) for e in edges) == [
        ("", 4, ("x",)), ("polyfuse.cli.main", 3, ()), ("polyfuse.engine.run", 2, ("train",))]


def test_task_type_folders_are_those_that_register_one():
    owners = _task_type_folders()
    assert {"tabular", "vqa", "captioning", "retrieval", "chimera"} <= owners and "ranking" not in owners
    assert _task_folder("polyfuse.tasks.vqa.spec") == "vqa" and _task_folder("polyfuse.tasks.registry") is None


def test_checker_sees_task_branches():
    names = {"vqa", "captioning"}
    compare = ast.parse('task.type in ("vqa", "other")').body[0].value
    assert _task_constants(compare.comparators[0], names, {}) == ["vqa"]
    assert _task_constants(ast.parse("kind == CAPTIONS").body[0].value.comparators[0], names,
                           {"CAPTIONS": "captioning"}) == ["captioning"]
    assert _task_constants(ast.parse('"tabular"').body[0].value, names, {}) == []
    assert re.search("rule f", str(Violation("engine/run.py", 3, "f", "x"))) is not None
