"""Changed defaults: a run records its polyfuse version, and an older configuration or
checkpoint that relies on a default changed since gets a warning naming the key."""

import logging

import pytest
import yaml

from polyfuse import __version__
from polyfuse.engine.compat import (
    DEFAULT_CHANGES,
    default_change_warnings,
    defaults_then,
    parse_version,
)
from polyfuse.engine.config import resolve_config
from polyfuse.engine.run import load_model, train


def lmf(**options):
    return {"model": {"fusion": "lmf", "options": {"lmf": options} if options else {}}}


def test_an_old_saved_config_relying_on_a_changed_default_is_told_so():
    [message] = default_change_warnings(lmf(), origin="runs/x/config.yaml")
    assert message.startswith("runs/x/config.yaml (no polyfuse version recorded (before 0.2.0)) relies on the "
                              "default of model.options.lmf.subnetworks, which changed in 0.2.0 from 'light' to 'paper'")
    assert "set model.options.lmf.subnetworks: light to build what it built then" in message
    # the key set, another module, or a version at or after the change: nothing to say
    assert default_change_warnings(lmf(subnetworks="paper"), origin="c") == []
    assert default_change_warnings({"model": {"fusion": "concat"}}, origin="c") == []
    assert default_change_warnings({**lmf(), "polyfuse_version": "0.2.0"}, origin="c") == []
    # a configuration file: no version means this one; an older one stated is checked
    assert default_change_warnings(lmf(), origin="c", saved=False) == []
    assert len(default_change_warnings({**lmf(), "polyfuse_version": "0.1.0"}, origin="c", saved=False)) == 1
    man = default_change_warnings({"model": {"fusion": "man", "options": {"man": {"estimator": "arf"}}}}, origin="c")
    assert [m.split("default of ")[1].split(",")[0] for m in man] == [
        "model.options.man.stacking", "model.options.man.mode", "model.options.man.exact_lsc"]


def test_the_table_is_ordered_and_versions_parse():
    assert parse_version("0.10.2+local") == (0, 10, 2) and parse_version("1.0rc1") == (1, 0)
    with pytest.raises(ValueError, match="not a version"):
        resolve_config({"polyfuse_version": "latest"})
    assert all(parse_version(c.version) <= parse_version(__version__) for c in DEFAULT_CHANGES)
    assert len({c.key for c in DEFAULT_CHANGES}) == len(DEFAULT_CHANGES)


def test_a_run_records_its_version_and_an_unversioned_run_warns_on_resume_and_load(tmp_path, caplog):
    config = {
        "seed": 0, "task": {"type": "classification"},
        "data": {"source": "synthetic:samples=60,lengths=4/5,dims=3/2,modalities=2,chunks=3", "batch_size": 16},
        "model": {"fusion": "man", "fusion_dim": 4, "out_dim": 4, "encoder": {"hidden_dim": 4},
                  "options": {"man": {"hidden_dim": 4, "heads": 1, "num_random_features": 4}}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "num_threads": 1, "patience": 0, "quiet": True,
                    "progress_bar": False},
    }
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="polyfuse.engine.compat"):
        train(resolve_config(config), run_dir=run)
    assert not caplog.records
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["polyfuse_version"] == __version__
    _, extras = load_model(run / "checkpoints" / "best.safetensors")
    assert extras["config"]["polyfuse_version"] == __version__ and not caplog.records
    # the same run as an older polyfuse wrote it: no version, MAN's estimator and stacking left to default
    del saved["polyfuse_version"]
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with caplog.at_level(logging.WARNING, logger="polyfuse.engine.compat"):
        train(None, resume=run)
    keys = sorted(r.getMessage().split("default of ")[1].split(",")[0] for r in caplog.records)
    assert keys == sorted(["model.options.man.estimator", "model.options.man.stacking", "model.options.man.mode",
                           "model.options.man.exact_lsc"])
    assert all(r.getMessage().startswith(f"{run / 'config.yaml'} (no polyfuse version recorded") for r in caplog.records)


def test_defaults_then_builds_an_old_layout_and_leaves_the_rest():
    old = {"task": {"type": "captioning"}, "decoder": {"variant": "HOCA-B"}, "polyfuse_version": "0.2.0"}
    then = defaults_then(old)
    # the layout change is set back; the generation default (allow_unknown) only warns
    assert then["decoder"] == {"variant": "HOCA-B", "encoder": "linear"} and "captioning" not in then
    assert old["decoder"] == {"variant": "HOCA-B"}  # the argument is left as it was
    assert defaults_then({**old, "polyfuse_version": "0.3.0"})["decoder"] == {"variant": "HOCA-B"}
    assert defaults_then({**old, "decoder": {"encoder": "bilstm"}})["decoder"] == {"encoder": "bilstm"}
    assert defaults_then({**old, "decoder": {"feature_dim": None}})["decoder"] == {"feature_dim": None}
    assert defaults_then(lmf()) == lmf()  # no layout change of its own is marked
    unversioned = defaults_then({"task": {"type": "captioning"}})
    assert unversioned["decoder"]["encoder"] == "linear"
