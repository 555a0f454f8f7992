"""What a polyfuse before 0.4.0 wrote is refused: a checkpoint or saved run that records an
older ``polyfuse_version``, or none, and a configuration file stating an older one. Each
refusal is one ``polyfuse <cmd>: error:`` line naming the version and the
``polyfuse train --config`` that retrains; what 0.4.0 wrote still loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from tests.tiny.synthetic import CLI_CONFIG

from polyfuse import __version__
from polyfuse.cli.main import EXIT_INPUT, main
from polyfuse.engine.checkpoints import read_checkpoint, write_checkpoint
from polyfuse.engine.config import OLDEST_READABLE, check_written_by

READS = f"(this is {__version__}, which reads {{}} of {OLDEST_READABLE} and later)"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 1-epoch run of the tiny CLI configuration (which states no polyfuse_version)."""
    folder = tmp_path_factory.mktemp("versions")
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(folder / "runs")}))
    assert main(["train", "--config", str(config), "--out", str(folder / "run"), "--max-epochs", "1", "--quiet"]) == 0
    return folder / "run"


def _copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def _record(run: Path, version: str | None) -> None:
    """Make ``run`` look written by polyfuse ``version`` (None: one that recorded none)."""
    def set_version(config: dict) -> None:
        config.pop("polyfuse_version", None)
        if version is not None:
            config["polyfuse_version"] = version

    for path in (run / "checkpoints").glob("*.safetensors"):
        checkpoint = read_checkpoint(path)
        set_version(checkpoint["polyfuse"]["config"])
        write_checkpoint(checkpoint, path)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    set_version(saved)
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))


def _refused(capsys, argv: list[str]) -> str:
    """Run ``argv``; it must fail with exit 2 and exactly one error line on stderr, no traceback."""
    capsys.readouterr()
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    prefix = f"polyfuse {argv[0]}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix):]


def test_the_run_records_this_version_and_its_checkpoint_still_loads(trained, tmp_path, capsys):
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    best = trained / "checkpoints" / "best.safetensors"
    assert saved["polyfuse_version"] == __version__ == OLDEST_READABLE
    assert read_checkpoint(best)["polyfuse"]["config"]["polyfuse_version"] == __version__
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(best)]) == 0
    assert main(["predict", "--checkpoint", str(best), "--out", str(tmp_path / "p.csv")]) == 0
    assert (tmp_path / "p.csv").read_text().count("\n") > 1
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_checkpoint_of_0_3_0_is_refused(trained, tmp_path, capsys, command):
    run = _copy(trained, tmp_path)
    _record(run, "0.3.0")
    best = run / "checkpoints" / "best.safetensors"
    argv = [command, "--checkpoint", str(best)] + (["--out", str(tmp_path / "p.csv")] if command == "predict" else [])
    assert _refused(capsys, argv) == (
        f"{best} was written by polyfuse 0.3.0 {READS.format('checkpoints')}: retrain it with "
        f"polyfuse train --config {run / 'config.yaml'} after deleting its polyfuse_version line"
    )
    assert not (tmp_path / "p.csv").exists()


def test_a_checkpoint_recording_no_version_is_refused(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    _record(run, None)
    best = run / "checkpoints" / "best.safetensors"
    assert _refused(capsys, ["evaluate", "--checkpoint", str(best)]) == (
        f"{best} records no polyfuse_version (written by a polyfuse before 0.2.0) "
        f"{READS.format('checkpoints')}: retrain it with polyfuse train --config {run / 'config.yaml'}"
    )


def test_a_moved_checkpoint_is_told_to_retrain_from_its_configuration(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    _record(run, "0.2.0")
    moved = tmp_path / "best.safetensors"
    shutil.copy(run / "checkpoints" / "best.safetensors", moved)
    message = _refused(capsys, ["evaluate", "--checkpoint", str(moved)])
    assert message.startswith(f"{moved} was written by polyfuse 0.2.0 ")
    assert message.endswith("retrain it with polyfuse train --config and the configuration it was trained with")


@pytest.mark.parametrize("version", ["0.3.0", None])
def test_resuming_a_run_of_an_older_version_is_refused(trained, tmp_path, capsys, version):
    run = _copy(trained, tmp_path)
    _record(run, version)
    before = sorted(p.name for p in run.rglob("*"))
    message = _refused(capsys, ["train", "--resume", str(run)])
    last = run / "checkpoints" / "last.safetensors"
    written = "was written by polyfuse 0.3.0" if version else "records no polyfuse_version (written by a polyfuse before 0.2.0)"
    assert message.startswith(f"{last} {written} {READS.format('checkpoints')}: retrain it with ")
    assert f"polyfuse train --config {run / 'config.yaml'}" in message
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written, no lock left


def test_resuming_a_run_whose_config_yaml_records_no_version_is_refused(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    del saved["polyfuse_version"]  # the checkpoints still record 0.4.0
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert _refused(capsys, ["train", "--resume", str(run)]) == (
        f"{run / 'config.yaml'} records no polyfuse_version (written by a polyfuse before 0.2.0) "
        f"{READS.format('saved runs')}: retrain it with polyfuse train --config {run / 'config.yaml'}"
    )


def test_a_config_file_stating_0_3_0_is_refused_and_one_stating_none_trains(tmp_path, capsys):
    config = tmp_path / "old.yaml"
    config.write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(tmp_path / "runs"), "polyfuse_version": "0.3.0"}))
    assert _refused(capsys, ["train", "--config", str(config)]) == (
        f"{config} states polyfuse_version 0.3.0 {READS.format('configurations')}: check it against "
        f"CHANGELOG.md, delete that line and train with polyfuse train --config {config}"
    )
    assert not (tmp_path / "runs").exists()
    # the same configuration through --set: refused as well, naming the run
    current = tmp_path / "current.yaml"
    current.write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(tmp_path / "runs")}))
    message = _refused(capsys, ["train", "--config", str(current), "--set", "polyfuse_version=0.3.0"])
    assert message.startswith("configuration 'current' states polyfuse_version 0.3.0 ")
    config.write_text(yaml.safe_dump({**CLI_CONFIG, "output_dir": str(tmp_path / "runs"), "polyfuse_version": "latest"}))
    assert _refused(capsys, ["train", "--config", str(config)]) == "polyfuse_version 'latest' is not a version such as 0.4.0"
    assert not (tmp_path / "runs").exists()
    # without the record: taken as this version, trained, and the run records it
    assert main(["train", "--config", str(current), "--out", str(tmp_path / "run"), "--max-epochs", "1", "--quiet"]) == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["polyfuse_version"] == __version__


def test_a_base_file_stating_an_older_version_is_refused_naming_it(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**CLI_CONFIG, "polyfuse_version": "0.2.0"}))
    top = tmp_path / "top.yaml"
    top.write_text(yaml.safe_dump({"base": "base.yaml", "output_dir": str(tmp_path / "runs")}))
    message = _refused(capsys, ["train", "--config", str(top)])
    assert message.startswith(f"{base} states polyfuse_version 0.2.0 ")


def test_versions_compare_as_numbers():
    check_written_by({"polyfuse_version": "0.10.0"}, "c", saved=True)  # later than 0.4.0, not "0.1..."
    check_written_by({"polyfuse_version": "0.4.0"}, "c", saved=True)
    check_written_by({}, "c", saved=False)  # a configuration stating none: this version
    with pytest.raises(ValueError, match=r"^c was written by polyfuse 0\.3\.9 "):
        check_written_by({"polyfuse_version": "0.3.9"}, "c", saved=True)
    with pytest.raises(ValueError, match=r"^c was written by polyfuse 0\.4\.0rc1 "):
        check_written_by({"polyfuse_version": "0.4.0rc1"}, "c", saved=True)
    with pytest.raises(ValueError, match=r"^c records no polyfuse_version"):
        check_written_by({}, "c", saved=True)
    with pytest.raises(ValueError, match="polyfuse_version 'latest' is not a version such as"):
        check_written_by({"polyfuse_version": "latest"}, "c", saved=False)
