"""docs/RELIABILITY.md names only tests that exist, and its counts are the table's."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "RELIABILITY.md"
ROW = re.compile(r"^\|(?P<fault>[^|]+)\|(?P<behaviour>.+)\|\s*`(?P<test>tests/[^`]+::test_\w+)`\s*\|$")


def rows():
    return [m.groupdict() for line in DOC.read_text().splitlines() if (m := ROW.match(line.strip()))]


def test_every_named_test_exists():
    found = rows()
    assert found, "no table rows"
    functions = {}
    for row in found:
        path, name = row["test"].split("::")
        if path not in functions:
            tree = ast.parse((ROOT / path).read_text())
            functions[path] = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions[path], row["test"]


def test_the_counts_are_the_tables():
    found = rows()
    tests = {row["test"] for row in found}
    match = re.search(r"Counts: (\d+) faults and bad inputs, shown by (\d+) test functions", DOC.read_text())
    assert match, "counts line missing"
    assert (int(match.group(1)), int(match.group(2))) == (len(found), len(tests))
    # Every table line is a row with a test (no row lost to a formatting slip).
    table_lines = [
        line for line in DOC.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| fault") and not line.startswith("| code")
    ]
    assert len(table_lines) == len(found)
