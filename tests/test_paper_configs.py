"""Every configuration of configs/papers/ (one per row of the papers' tables that polyfuse
can run, docs/PAPERS.md) builds: read as a user reads it, from a copy of the folder beside
generated files in the layouts it names (tests/tiny/papers.py), its data readers and model
are constructed and its optimiser is the paper's (:func:`polyfuse.engine.run.dry_run`); no
training. A table row of docs/PAPERS.md names each file, and each file is in the table."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tests.tiny.papers import (
    write_captioning,
    write_experts,
    write_flickr30k_entities,
    write_glove,
    write_vqa2,
    write_word_aligned,
)

from polyfuse.cli.main import main
from polyfuse.engine.config import load_config
from polyfuse.engine.run import dry_run

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "configs" / "papers"
CONFIGS = sorted(p.relative_to(PAPERS).as_posix() for p in PAPERS.rglob("*.yaml"))
#: optim.optimizer -> the torch class a run trains with
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "adamax": "Adamax"}
#: keys that name what a file is rather than a value a paper could state
STRUCTURAL = {"name", "output_dir", "seed", "type", "fusion", "backbone", "variant", "expert", "monitor"}
SCHEDULERS = {"none": None, "cosine": "CosineAnnealingLR", "ban_warmup": "LambdaLR", "step": "StepLR"}


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """<tmp>/configs/papers (a copy) and <tmp>/data/ (generated), as below a repository."""
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(PAPERS, root / "configs" / "papers")
    data = root / "data"
    data.mkdir()
    write_glove(data)
    write_vqa2(data)
    write_flickr30k_entities(data)
    write_captioning(data, "msvd")
    write_captioning(data, "msrvtt", seed=1)
    write_word_aligned(data, "cmu_mosi")
    write_word_aligned(data, "pom", seed=1)
    ce_experts = {"appearance": 2048, "motion": 1024, "audio": 128, "scene": 2208, "ocr": 300, "speech": 300, "face": 512}
    write_experts(data, "msrvtt_ce", ce_experts)
    write_experts(data, "lsmdc_ce", ce_experts, seed=1)
    write_experts(data, "flickr30k_retrieval", {"regions": 2048}, seed=2)
    write_experts(data, "mscoco_retrieval", {"regions": 2048}, seed=3)
    return root


def test_there_are_paper_configurations():
    assert len(CONFIGS) >= 40 and {c.split("/")[0] for c in CONFIGS} == {"ban", "hoca", "man", "chimera"}


@pytest.mark.parametrize("name", CONFIGS)
def test_paper_configuration_builds_on_its_data_layout(copy, name):
    config = load_config(copy / "configs" / "papers" / name)
    built = dry_run(config)
    assert built.task == config["task"]["type"]
    assert built.parameters > 0 and all(rows > 0 for rows in built.samples.values()), built
    assert {"train", "val"} <= set(built.samples)
    optim = config.get("optim", {})
    assert built.optimizer == OPTIMIZERS[optim.get("optimizer", "adamw")]
    assert built.scheduler == SCHEDULERS[optim.get("scheduler", "none")]


def test_every_paper_configuration_cites_where_its_values_come_from():
    """Each file says which row it is; each setting of a recipe (a file without ``base:``)
    has a comment: its source, or that no source states it and what was chosen."""
    uncited = []
    for name in CONFIGS:
        text = (PAPERS / name).read_text()
        assert text.startswith("#"), f"{name}: start with the row it is and where its values come from"
        if "base:" in text:
            continue
        for line in text.splitlines():
            setting = re.match(r"\s+(\w+): (?!\{)\S", line)
            if setting and setting.group(1) not in STRUCTURAL and "#" not in line and "../../../data/" not in line:
                uncited.append(f"{name}: {line.strip()}")
    assert not uncited, "settings that cite no source and do not say that none states them:\n" + "\n".join(uncited)


def test_every_paper_configuration_is_in_the_reproduction_page():
    page = (ROOT / "docs" / "PAPERS.md").read_text()
    missing = [name for name in CONFIGS if f"configs/papers/{name}" not in page]
    assert not missing, f"docs/PAPERS.md does not name {missing}"


def test_dry_run_from_the_command_line(copy, capsys):
    assert main(["train", "--config", str(copy / "configs" / "papers" / "man" / "mosi.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"task sentiment: train 12, val 6, test 6 rows; [\d,]+ trainable parameters; optimiser Adam", out), out
    assert not list((copy / "runs" / "papers").glob("mosi-man*"))  # no run directory
