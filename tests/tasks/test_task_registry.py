"""The task registry: names, lookups, refusals (the contract test runs the specs)."""

from __future__ import annotations

import pytest

from polyfuse.tasks import registry
from polyfuse.tasks.registry import TaskSpec, available_tasks, register_task, task_spec, task_specs


def test_the_built_in_task_types_are_registered_once_each():
    names = available_tasks()
    assert {"sentiment", "traits", "classification", "vqa", "captioning"} <= set(names)
    assert len(names) == len(set(names))
    assert [spec.name for spec in task_specs()] == names
    assert all(task_spec(name).name == name for name in names)


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
    assert spec.data_files({}) == [] and spec.baselines({}) == {} and spec.summary([], None) is None
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
