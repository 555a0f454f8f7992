"""A strict configuration: unknown keys everywhere (with did-you-mean), type and range
checks, sections that --set cannot wipe, paths relative to the config file, run
names that cannot escape output_dir, bounded YAML, a generated reference."""

import subprocess
import sys
from pathlib import Path

import pytest

from polyfuse.engine.config import apply_overrides, load_config, resolve_config
from polyfuse.engine.schema import fusion_option_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"trainer": {"gradient_clip_val": -1.0}}, r"'trainer.gradient_clip_val': Input should be greater than 0 \(got -1.0\)"),
        ({"trainer": {"max_epochs": True}}, r"'trainer.max_epochs': Input should be a valid integer \(got True\)"),
        ({"trainer": {"num_threads": -1}}, r"'trainer.num_threads': Input should be greater than or equal to 1"),
        ({"data": {"validation_fraction": None}}, r"'data.validation_fraction': Input should be a valid number \(got None\)"),
        ({"data": {"batch_size": 0}}, r"'data.batch_size': Input should be greater than or equal to 1"),
        ({"model": {"options": {"concat": 3}}}, r"'model.options.concat': Input should be a valid dictionary \(got 3\)"),
        ({"output_dir": None}, r"'output_dir': Input should be a valid string \(got None\)"),
        ({"seed": 2**40}, r"'seed': a seed must lie in \[0, 4294967295\] \(got 1099511627776\)"),
        ({"seed": -1}, r"'seed': a seed must lie in \[0, 4294967295\] \(got -1\)"),
        ({"optim": {"lr": "fast"}}, r"'optim.lr': Input should be a valid number \(got 'fast'\)"),
        ({"trainer": {"min_epochs": 5, "max_epochs": 2}}, r"trainer.min_epochs \(5\) exceeds trainer.max_epochs \(2\)"),
        ({"task": {"type": "sentimnet"}}, r"unknown task type 'sentimnet' \(did you mean 'sentiment'\?\)"),
        ({"trainer": {"monitor": "train/loss"}}, r"must be a validation metric"),
        ({"trainer": {"precision": "8-true"}}, r"'trainer.precision': Input should be"),
        ({"data": {"split_values": {"tran": ["a"]}}}, r"'data.split_values.tran': Input should be 'train', 'val' or 'test'"),
        ({"name": "../../x"}, r"run name '../../x' must be a plain directory name"),
        ({"name": "/etc"}, r"must be a plain directory name"),
    ],
)
def test_values_are_type_and_range_checked(config, message):
    with pytest.raises(ValueError, match=message):
        resolve_config(config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model": {"options": {"man": {"hiden_dim": 3}}}},
         r"unknown config key 'model.options.man.hiden_dim' \(did you mean 'hidden_dim'\?\); known keys under 'model.options.man': attention_dim"),
        ({"model": {"options": {"mann": {}}}}, r"model.options: unknown fusion module 'mann' \(did you mean 'man'\?\)"),
        ({"model": {"input_groups": {"bam": [["a"], ["b"]]}}}, r"model.input_groups: unknown fusion module 'bam' \(did you mean 'ban'\?\)"),
        ({"model": {"input_groups": {"ban": [["a"], [3]]}}}, r"'model.input_groups.ban.1.0': Input should be a valid string"),
        ({"model": {"options": {"man": {"hidden_dim": True}}}}, r"'model.options.man.hidden_dim': got a boolean where int goes"),
        ({"model": {"options": {"man": {"orthogonal": 3}}}}, r"'model.options.man.orthogonal': Input should be a valid boolean"),
        ({"model": {"options": {"tfn": {"max_fused_size": "big"}}}}, r"'model.options.tfn.max_fused_size': Input should be a valid integer"),
        ({"data": {"contxt": {}}}, r"unknown config key 'data.contxt' \(did you mean 'context'\?\)"),
    ],
)
def test_unknown_keys_everywhere_with_did_you_mean(config, message):
    with pytest.raises(ValueError, match=message):
        resolve_config(config)


def test_option_schemas_come_from_the_constructors():
    import inspect

    import polyfuse.nn

    for name in polyfuse.nn.available():
        signature = inspect.signature(polyfuse.nn.get(name).__init__)
        expected = {p for p in signature.parameters if p not in ("self", "input_dims", "out_dim")}
        expected -= {p.name for p in signature.parameters.values() if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        assert set(fusion_option_model(name).model_fields) == expected, name
    # A valid set of options passes, and its values are kept as given (not converted).
    resolved = resolve_config({"model": {"options": {"man": {"hidden_dim": 8, "mode": "exact"}}}})
    assert resolved["model"]["options"] == {"man": {"hidden_dim": 8, "mode": "exact"}}


def test_set_never_wipes_a_section():
    with pytest.raises(ValueError, match=r"bad --set 'trainer=3': 'trainer' is a section"):
        apply_overrides({"trainer": {"max_epochs": 2}}, ["trainer=3"])
    with pytest.raises(ValueError, match=r"'model.encoder' is a section"):
        apply_overrides({}, ["model.encoder=gru"])
    merged = apply_overrides({"trainer": {"max_epochs": 2}}, ["trainer={patience: 1}"])
    assert merged == {"trainer": {"max_epochs": 2, "patience": 1}}
    assert apply_overrides({}, ["model.options.man.heads=2"]) == {"model": {"options": {"man": {"heads": 2}}}}
    # Free mappings (not sections) are replaced: {} clears them.
    groups = {"model": {"input_groups": {"ban": [["m0"], ["m1"]]}}}
    assert apply_overrides(groups, ["model.input_groups={}"]) == {"model": {"input_groups": {}}}


def test_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    folder = tmp_path / "configs" / "deep"
    folder.mkdir(parents=True)
    (folder / "base.yaml").write_text("data: {source: ../features.npz}\n")
    (folder / "run.yaml").write_text("base: base.yaml\noutput_dir: ../../runs\n")
    monkeypatch.chdir(tmp_path / "configs")  # somewhere else than the file
    config = load_config(folder / "run.yaml")
    assert config["data"]["source"] == str(tmp_path / "configs" / "features.npz")
    assert config["output_dir"] == str(tmp_path / "runs")
    (folder / "synthetic.yaml").write_text("data: {source: 'synthetic:samples=20'}\n")
    assert load_config(folder / "synthetic.yaml")["data"]["source"] == "synthetic:samples=20"


def test_yaml_alias_bombs_size_and_depth_are_refused(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="more than 64 aliases"):
        load_config(tmp_path / "bomb.yaml")
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        load_config(tmp_path / "deep.yaml")
    (tmp_path / "big.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ValueError, match="config files are limited to 1048576 bytes"):
        load_config(tmp_path / "big.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_config(tmp_path / "latin1.yaml")
    (tmp_path / "python.yaml").write_text("seed: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(tmp_path / "python.yaml")


def test_the_configuration_reference_is_up_to_date():
    script = ROOT / "scripts" / "config_reference.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    for key in ("`trainer.gradient_clip_val`", "`model.options.man.hidden_dim`", "`data.validation_fraction`"):
        assert key in text


def test_man_exact_limit_counts_tuples_not_sizes():
    """MAN's exact_limit is a number of tuples (default 2^16): it takes values beyond the
    bound on layer sizes, up to the element bound."""
    from polyfuse.sizes import MAX_ELEMENTS_OPTION, MAX_SIZE

    accepted = resolve_config({"model": {"fusion": "man", "options": {"man": {"exact_limit": 1 << 20}}}})
    assert accepted["model"]["options"]["man"]["exact_limit"] == 1 << 20 > MAX_SIZE
    with pytest.raises(ValueError, match="exact_limit"):
        resolve_config({"model": {"fusion": "man", "options": {"man": {"exact_limit": MAX_ELEMENTS_OPTION + 1}}}})
