"""polyfuse.text, the ground floor that data and metrics share: its place in the import
graph, the names kept at their old homes, and the VQA question tokeniser (the answer
rules are checked in tests/metrics/test_vqa_metric.py, the PTB tokeniser in
tests/tasks/captioning/test_captioning_data.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import polyfuse
from polyfuse import text

PACKAGE = Path(polyfuse.__file__).parent


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Every module that a file of ``folder`` imports, function-local imports included."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        found[str(path.relative_to(PACKAGE))] = names
    return found


def test_data_and_metrics_do_not_import_each_other():
    for folder, other in (("data", "polyfuse.metrics"), ("metrics", "polyfuse.data")):
        crossing = {
            file: sorted(m for m in modules if m == other or m.startswith(other + "."))
            for file, modules in imported_modules(PACKAGE / folder).items()
        }
        assert {file: ms for file, ms in crossing.items() if ms} == {}, f"{folder}/ imports {other}"


def test_text_imports_nothing_of_polyfuse():
    assert not {m for m in imported_modules(PACKAGE)["text.py"] if m.startswith("polyfuse")}


def test_documented_names_are_the_shared_functions():
    from polyfuse.metrics import vqa as vqa_metric

    for name in ("normalize_answer", "process_punctuation", "process_digit_article", "vqa_accuracy"):
        assert getattr(vqa_metric, name) is getattr(text, name)


def test_tokenize_question_by_hand():
    assert text.tokenize_question("Is it the dog's ball?") == ["is", "it", "the", "dog", "'s", "ball"]
    # commas and question marks go, other punctuation stays glued; whitespace collapses
    assert text.tokenize_question("Red,  white\tor BLUE-ish?") == ["red", "white", "or", "blue-ish"]
    assert text.tokenize_question("  ?, ") == []
