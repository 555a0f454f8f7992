"""Configuration files, base links, --set overrides and validation messages."""

import pytest

from polyfuse.engine.config import (
    DEFAULTS,
    apply_overrides,
    load_config,
    parse_value,
    resolve_config,
)


def test_base_links_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("seed: 3\noptim: {lr: 1e-3, weight_decay: 0.01}\nmodel: {fusion: man}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\noptim: {lr: 5e-4}\n")
    config = load_config(tmp_path / "child.yaml")
    assert config["optim"] == {"lr": 5e-4, "weight_decay": 0.01} and config["seed"] == 3
    config = apply_overrides(config, ["trainer.max_epochs=7", "data.modalities=[a, b]", "data.context.group_by=video"])
    resolved = resolve_config(config)
    assert resolved["trainer"]["max_epochs"] == 7
    assert resolved["data"]["modalities"] == ["a", "b"]
    assert resolved["data"]["context"] == {"group_by": "video", "order_by": None, "window": None}
    assert resolved["trainer"]["patience"] == DEFAULTS["trainer"]["patience"]


def test_values_parse_as_yaml_with_exponent_floats():
    assert parse_value("1e-3") == pytest.approx(0.001)
    assert parse_value("true") is True and parse_value("null") is None
    assert parse_value("text,audio") == "text,audio"
    assert resolve_config({"data": {"modalities": "text, audio"}})["data"]["modalities"] == ["text", "audio"]


def test_errors_name_the_key_and_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config key 'model.fusoin' \(did you mean 'fusion'\?\); known keys under 'model': backbone, centre_marker, dropout, encoder"):
        resolve_config({"model": {"fusoin": "man"}})
    with pytest.raises(ValueError, match="unknown config key 'trainr'"):
        resolve_config({"trainr": {}})
    with pytest.raises(ValueError, match=r"config key 'trainer\.max_epochs': Input should be a valid integer \(got 'ten'\)"):
        resolve_config({"trainer": {"max_epochs": "ten"}})
    with pytest.raises(ValueError, match=r"unknown config key 'data.context.size'; known keys under 'data.context': group_by, order_by, window"):
        resolve_config({"data": {"context": {"group_by": "v", "size": 3}}})
    with pytest.raises(ValueError, match="bad --set 'lr'"):
        apply_overrides({}, ["lr"])
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ValueError, match="circular"):
        load_config(tmp_path / "loop.yaml")


def test_compare_model_entries(tmp_path):
    from polyfuse.engine.compare import parse_models

    (tmp_path / "variant.yaml").write_text(
        "data: {source: other.npz}\nmodel: {fusion: man, options: {man: {mode: exact}}}\noptim: {lr: 0.1}\n"
    )
    entries = parse_models(f"tfn,{tmp_path / 'variant.yaml'}")
    assert [e.label for e in entries] == ["tfn", "variant"]
    assert entries[0].update == {"model": {"fusion": "tfn"}}
    assert set(entries[1].update) == {"model", "optim"}  # data, task, trainer stay the base's
    with pytest.raises(ValueError, match="unknown fusion module 'manx'"):
        parse_models("manx")
    with pytest.raises(ValueError, match="twice"):
        parse_models("man,man")
