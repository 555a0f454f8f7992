"""Every shipped retrieval and Chimera configuration validates, and its paths point where
today's commands read (../shared/data/msvd from the repository root)."""

from pathlib import Path

import pytest

from polyfuse.engine.config import load_config
from polyfuse.engine.schema import RunConfig, validate_config
from polyfuse.tasks.chimera.spec import ABLATION_ROWS, ChimeraConfig
from polyfuse.tasks.registry import task_spec

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted(
    path for folder in ("msvd/retrieval", "msvd/chimera", "synthetic/retrieval")
    for path in (ROOT / "configs" / folder).glob("*.yaml")
)


def _validate(config: dict) -> None:
    spec = task_spec(config["task"]["type"])
    if all(name in RunConfig.model_fields for name in spec.config_sections):
        validate_config(config)  # the engine's schema knows the task's sections
        return
    rest = {k: v for k, v in config.items() if k != "task" and k not in spec.config_sections}
    validate_config(rest)  # the shared sections
    for name, section in spec.config_sections.items():
        section.model_validate(config[name])


def test_there_are_shipped_configs():
    names = {p.parent.name + "/" + p.stem for p in CONFIGS}
    assert {f"retrieval/{f}" for f in ("mean", "man", "concat", "gating", "mean+man", "gating+man")} <= names
    assert {f"chimera/{row}" for row in ABLATION_ROWS} <= names  # every row of Table 4 (and noLT)


@pytest.mark.parametrize("row", list(ABLATION_ROWS))
def test_each_chimera_config_sets_its_rows_switches(row):
    section = ChimeraConfig.model_validate(load_config(ROOT / "configs" / "msvd" / "chimera" / f"{row}.yaml")["chimera"])
    defaults = ChimeraConfig(source="x")
    for key in ("num_topics", "topic_variant", "tlm", "hyperbolic_dim", "hlm", "distortion", "topic_lm"):
        assert getattr(section, key) == ABLATION_ROWS[row].get(key, getattr(defaults, key)), key


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}")
def test_a_shipped_config_validates_and_reads_the_shared_data(path):
    config = load_config(path)
    _validate(config)
    section = config[config["task"]["type"]]
    source = section["source"]
    if not source.startswith("synthetic"):
        assert Path(source) == (ROOT.parent / "shared" / "data" / "msvd").resolve()
