"""What ``import polyfuse`` loads (issue 17: importing must stay cheap). Checked by the
modules it pulls in, not by timing: torch only when a subpackage is touched; the
training stack and geoopt (which imports scipy) only where they are used."""

import subprocess
import sys


def loaded_after(statement):
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_polyfuse_does_not_import_torch():
    modules = loaded_after("import polyfuse")
    assert "torch" not in modules


def test_the_layers_do_not_import_the_training_stack_or_geoopt():
    modules = loaded_after("import polyfuse.nn, polyfuse.nn.backbones, polyfuse.nn.models, polyfuse.functional")
    assert "torch" in modules
    for heavy in ("geoopt", "scipy", "lightning", "torchmetrics", "pydantic", "h5py", "matplotlib"):
        assert heavy not in modules, f"import polyfuse.nn loads {heavy}"


def test_geoopt_is_imported_on_first_use():
    modules = loaded_after(
        "import torch, polyfuse.functional as F; F.lorentz_inner(torch.zeros(1, 3), torch.zeros(1, 3))"
    )
    assert "geoopt" in modules
