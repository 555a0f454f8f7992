"""docs/ARCHITECTURE.md's table of where each task type lives is the one the code gives
(scripts/architecture_table.py), and the script reads the code it claims to read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("architecture_table", ROOT / "scripts" / "architecture_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_task_table_is_up_to_date():
    assert _script().main(["--check"]) == 0, "run: python scripts/architecture_table.py"


def test_every_registered_task_type_has_its_folder():
    from polyfuse.tasks.registry import available_tasks, task_spec

    folders = _script().folders()
    owned = {name: folder for folder, names in folders.items() for name in names}
    assert sorted(owned) == sorted(available_tasks())
    for name, folder in owned.items():  # the spec's class is defined in its folder
        assert task_spec(name).__class__.__module__.startswith(f"polyfuse.tasks.{folder}."), name


def test_imports_are_read_as_modules(tmp_path):
    script = _script()
    source = tmp_path / "x.py"
    source.write_text("from polyfuse.tasks import building\nimport polyfuse.nn.models.vqa\n"
                      "def f():\n    from polyfuse.metrics.vqa import VQAScore\n    from polyfuse.nn import create\n")
    assert script.imported_modules(source) == {"tasks/building.py", "nn/models/vqa.py", "metrics/vqa.py", "nn/"}
