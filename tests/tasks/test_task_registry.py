"""The task registry: names, lookups, refusals, and the declarations every registered
spec makes (its sections, monitor, options, files), checked spec by spec (the contract
test, tests/tasks/test_task_contract.py, trains each)."""

from __future__ import annotations

import itertools
import keyword
import typing

import pytest
from pydantic import BaseModel

from polyfuse.engine.schema import RunConfig
from polyfuse.tasks import registry
from polyfuse.tasks.registry import (
    TaskSpec,
    attention_task_types,
    available_tasks,
    register_task,
    task_spec,
    task_specs,
)

#: the task types polyfuse ships; a new one is checked below as soon as it is registered
BUILT_IN = {"sentiment", "traits", "classification", "vqa", "captioning", "retrieval", "chimera"}
#: what a spec must implement itself (TaskSpec's own versions raise NotImplementedError)
REQUIRED_METHODS = ("build_data", "build_module", "checkpoint_extras", "module_from_extras", "checkpoint_data",
                    "loaders", "records", "write_records")


def test_the_built_in_task_types_are_registered_once_each():
    names = available_tasks()
    assert set(names) >= BUILT_IN, BUILT_IN - set(names)
    assert len(names) == len(set(names))
    assert [spec.name for spec in task_specs()] == names
    assert all(task_spec(name).name == name for name in names)


def _is_path(path: str) -> bool:
    """A dotted configuration path of plain lower-case names."""
    parts = path.split(".")
    return all(part.isidentifier() and part == part.lower() and not keyword.iskeyword(part) for part in parts)


def _schema_field(path: str):
    """The annotation the engine's RunConfig gives ``path`` (None: no such field)."""
    model: typing.Any = RunConfig
    annotation = None
    for part in path.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        inner = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = inner[0] if inner else annotation
    return annotation


@pytest.mark.parametrize("name", available_tasks())
def test_every_registered_spec_declares_a_consistent_contract(name):
    spec = task_spec(name)
    assert isinstance(spec, TaskSpec) and spec.name == name and task_spec(name) is spec
    # Sections: dotted paths it owns; its config_sections among them, each a strict
    # pydantic model that the engine's schema holds at that path; the required ones owned.
    assert isinstance(spec.sections, tuple) and all(_is_path(path) for path in spec.sections), spec.sections
    assert len(set(spec.sections)) == len(spec.sections)
    assert set(spec.config_sections) <= set(spec.sections)
    assert set(spec.required_sections) <= set(spec.sections)
    for path, section in spec.config_sections.items():
        assert issubclass(section, BaseModel) and section.model_config.get("extra") == "forbid", path
        assert path.rpartition(".")[0] in ("", "data", "model"), f"{path}: the schema adds sections there only"
        annotation = _schema_field(path)
        assert annotation is not None and section in typing.get_args(annotation), f"{path} not in RunConfig"
    # The weights' layout: top-level sections, its own or the shared model section.
    assert spec.model_sections and all("." not in s and (s == "model" or s in spec.sections)
                                       for s in spec.model_sections), spec.model_sections
    # The best checkpoint's monitor: a validation metric and a direction.
    metric, mode = spec.default_monitor
    assert metric.startswith("val/") and len(metric) > len("val/") and mode in ("min", "max")
    assert spec.prediction_suffix in (".csv", ".json")
    # The task's own command options: names that argparse and a call can take.
    for options in (spec.predict_options, spec.evaluate_options):
        assert isinstance(options, dict) and all(key.isidentifier() for key in options), options
    assert isinstance(spec.figure_options, tuple) and all(option.isidentifier() for option in spec.figure_options)
    if spec.figure_options:  # options of a figure the spec draws
        assert name in attention_task_types()
    assert isinstance(spec.reads_own_files, bool)
    # The files of a configuration: keys of the spec's own sections that its models define.
    assert not set(spec.path_keys) & set(spec.path_mappings)
    for key in (*spec.path_keys, *spec.path_mappings):
        owner = [path for path in spec.config_sections if key.startswith(path + ".")]
        assert len(owner) == 1, f"{key}: not a key of one of {sorted(spec.config_sections)}"
        assert key[len(owner[0]) + 1:] in spec.config_sections[owner[0]].model_fields, key
    if spec.path_keys or spec.path_mappings:
        assert spec.sections, "a task that reads its own files owns the sections that name them"
    # What the engine calls: implemented by the spec, not TaskSpec's refusals.
    missing = [method for method in REQUIRED_METHODS if getattr(type(spec), method) is getattr(TaskSpec, method)]
    assert not missing, f"{name} does not implement {missing}"


def test_no_two_task_types_own_the_same_section():
    for first, second in itertools.combinations(task_specs(), 2):
        shared = set(first.sections) & set(second.sections)
        assert not shared, f"{first.name} and {second.name} both own {sorted(shared)}"


def test_an_unknown_task_type_names_the_closest_and_the_known_ones():
    with pytest.raises(ValueError) as error:
        task_spec("captionin")
    message = str(error.value)
    assert message.startswith("unknown task type 'captionin' (did you mean 'captioning'?); expected one of ")
    assert message.endswith(", ".join(available_tasks()))
    with pytest.raises(ValueError, match=r"^unknown task type 'zzz'; expected one of "):
        task_spec("zzz")


def test_registration_returns_the_class_and_refuses_a_second_class_under_a_taken_name(monkeypatch):
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))

    class Toy(TaskSpec):
        name = "toy"

    assert register_task(Toy) is Toy
    assert isinstance(task_spec("toy"), Toy) and available_tasks()[-1] == "toy"
    assert register_task(Toy) is Toy  # the same class again: no error
    assert type(task_spec("toy")) is Toy

    class Other(TaskSpec):
        name = "toy"

    with pytest.raises(ValueError, match=r"^task type 'toy' is already registered$"):
        register_task(Other)
    assert type(task_spec("toy")) is Toy


def test_the_defaults_of_a_spec_do_nothing_and_load_through_module_from_extras():
    spec = TaskSpec()
    assert spec.default_monitor == ("val/loss", "min") and spec.model_sections == ("model",)
    assert spec.prediction_suffix == ".csv" and spec.predict_options == {}
    assert spec.evaluate_options == {} and spec.figure_options == () and not spec.reads_own_files
    assert spec.baselines({}) == {} and spec.summary([], None) is None
    assert spec.prepare_module(None, {}, None, False) == {} and spec.after_test(None, None, None) == {}
    assert spec.check_config(None) is None
    with pytest.raises(NotImplementedError):
        spec.build_data({})

    import torch

    class Spec(TaskSpec):
        name = "linear"

        def module_from_extras(self, extras):
            return torch.nn.Linear(extras["in"], 2)

    reference = torch.nn.Linear(3, 2)
    loaded = Spec().load_module(reference.state_dict(), {"in": 3}, "ckpt")
    assert torch.equal(loaded.weight, reference.weight) and not loaded.training
    with pytest.raises(ValueError, match=r"^ckpt: the weights do not fit the stored configuration: "):
        Spec().load_module(reference.state_dict(), {"in": 4}, "ckpt")
