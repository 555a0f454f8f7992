"""Train every task type's tiny configuration (tests/tiny/tasks.py) and print, per task,
its test metrics and a digest of its best checkpoint's weights, as JSON: run it at two
commits and compare, to check that a change leaves default runs bit-identical.

    python scripts/tiny_fingerprints.py > after.json
    git worktree add /tmp/before REV && (cd /tmp/before && PYTHONPATH=src python scripts/tiny_fingerprints.py) > before.json
    diff before.json after.json
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))  # tests.tiny of the checkout it runs in

from safetensors.torch import load_file  # noqa: E402
from tests.tiny.tasks import TINY  # noqa: E402

from polyfuse.engine.run import train  # noqa: E402


def fingerprint(name: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"tiny-{name}-"))
    with contextlib.redirect_stdout(sys.stderr):  # the run's notes; stdout holds the JSON only
        result = train(TINY[name](folder), run_dir=folder / "run")
    state = load_file(str(result.best_checkpoint))
    weights = b"".join(state[key].numpy().tobytes() for key in sorted(state) if key.startswith("state_dict/"))
    return {"test": result.test, "weights": hashlib.sha256(weights).hexdigest()[:16]}


if __name__ == "__main__":
    print(json.dumps({name: fingerprint(name) for name in sorted(TINY)}, indent=1, sort_keys=True))
