"""A registry of task types: what the engine needs to know of a task, by name.

The pattern of :mod:`polyfuse.nn.registry` one floor up. A task type is one file of
:mod:`polyfuse.tasks` that defines a :class:`TaskSpec` subclass and registers it::

    @register_task
    class SentimentSpec(TabularSpec):
        name = "sentiment"
        ...

Importing this module imports the package :mod:`polyfuse.tasks` first, which imports
every task file, so the built-in task types are registered before any lookup.
``task.type`` in a configuration names the spec; :func:`task_spec` looks it up (an
unknown name lists the known ones). The engine (:mod:`polyfuse.engine.run`) has one
train / evaluate / predict / compare path and asks the spec for everything that
differs between tasks: the config sections it owns, its data, its Lightning module
around a model of :mod:`polyfuse.nn`, its checkpoint extras, its prediction records
and its comparison summary. The engine knows no task by name.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import lightning as L
from torch.utils.data import DataLoader

__all__ = [
    "TaskData",
    "TaskSpec",
    "attention_task_types",
    "available_tasks",
    "ranking_task_types",
    "register_task",
    "task_spec",
    "task_specs",
]


#: A task type's own prepared data: ``TabularData``, ``VQAData``, ``CaptioningData``,
#: ``RetrievalData``, ``ChimeraData``
Prepared = TypeVar("Prepared")


@dataclass
class TaskData(Generic[Prepared]):
    """A task's prepared data, as the engine handles it.

    ``prepared`` is the task's own ``<Task>Data`` (a spec annotates it, e.g.
    ``TaskData[VQAData]``) that the spec's other methods read; the engine never does.
    """

    datamodule: L.LightningDataModule
    prepared: Prepared
    samples: dict[str, int] = field(default_factory=dict)  # rows per split, for results.json
    steps_per_epoch: int = 1  # training batches per epoch (the logging interval is capped by it)
    split: str | None = None  # the split a checkpoint's data holds (evaluate, predict, plot); None: a training run


class TaskSpec:
    """What differs between task types. Subclass, set the class attributes, implement the
    methods, and decorate with :func:`register_task`.

    Class attributes:
        name: ``task.type`` in a configuration.
        config_sections: the top-level configuration sections the task adds, name ->
            strict pydantic model (``{"captioning": CaptioningConfig}``); the engine's
            schema gains them as optional keys.
        sections: dotted configuration paths the task owns (``"captioning"``,
            ``"data.vqa"``), its ``config_sections`` included; another task type's
            configuration may not set them.
        required_sections: those of ``sections`` a configuration must set.
        model_sections: the top-level sections that define the weights' layout; a run
            resumes only from a checkpoint trained with the same.
        default_monitor: the validation metric that picks the best checkpoint, and its mode.
        prediction_suffix: the file type ``predict --out`` writes (``.csv`` or ``.json``).
        predict_options: the task's own options of ``polyfuse predict`` and their
            defaults (VQA: ``images``, ``top_k``); another task refuses them.
        evaluate_options: the task's own options of ``polyfuse evaluate`` and their
            defaults (retrieval, Chimera: ``shuffle_words``), handed to
            :meth:`checkpoint_data`; another task refuses them.
        fusions: the names ``model.fusion`` takes: None for any fusion module of
            :mod:`polyfuse.nn` (the default), or the task type's own list (retrieval's video
            fusions, some of which are not modules); the schema checks it with the task.
        figure_options: the task's own options of ``polyfuse plot attention`` (VQA:
            ``question_ids``, ``images``); another task refuses them.
        reads_own_files: True when a checkpoint reads the files of its configuration
            only (``--data`` / ``--modalities`` do not apply).
        path_keys: dotted configuration keys that name files, and ``path_mappings``
            those whose values do (``captioning.features``): a config file's relative
            paths are anchored to its folder, and a run hashes the files it reads.
    """

    name: ClassVar[str]
    config_sections: ClassVar[dict[str, type]] = {}
    sections: ClassVar[tuple[str, ...]] = ()
    required_sections: ClassVar[tuple[str, ...]] = ()
    model_sections: ClassVar[tuple[str, ...]] = ("model",)
    default_monitor: ClassVar[tuple[str, str]] = ("val/loss", "min")
    prediction_suffix: ClassVar[str] = ".csv"
    predict_options: ClassVar[dict[str, Any]] = {}
    evaluate_options: ClassVar[dict[str, Any]] = {}
    fusions: ClassVar[tuple[str, ...] | None] = None
    figure_options: ClassVar[tuple[str, ...]] = ()
    reads_own_files: ClassVar[bool] = False
    path_keys: ClassVar[tuple[str, ...]] = ()
    path_mappings: ClassVar[tuple[str, ...]] = ()

    # -- configuration -------------------------------------------------------------
    def check_config(self, config: Any) -> None:
        """Rules across sections of a validated ``RunConfig`` (raise ValueError naming the
        keys); the engine has already checked ``sections`` and ``required_sections``."""

    # -- training ------------------------------------------------------------------
    def build_data(self, config: Mapping[str, Any]) -> TaskData:
        """The data of a training run: train, val and (optionally) test splits."""
        raise NotImplementedError

    def build_module(self, config: Mapping[str, Any], data: TaskData) -> L.LightningModule:
        """A new Lightning module around a new model for ``data``."""
        raise NotImplementedError

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData) -> dict[str, Any]:
        """What a checkpoint stores beside the weights to be used alone (the resolved
        configuration, vocabularies, statistics): the keys of
        :data:`polyfuse.engine.checkpoints.EXTRAS_KEYS` at least."""
        raise NotImplementedError

    def prepare_module(self, module: L.LightningModule, config: Mapping[str, Any], data: TaskData,
                       resuming: bool) -> dict[str, Any]:
        """Anything done to a new module before the first epoch (pre-trained word
        vectors); what it returns goes into results.json."""
        return {}

    def after_test(self, module: L.LightningModule, data: TaskData, run_dir: Path) -> dict[str, Any]:
        """After the best checkpoint was tested: files the task writes beside results.json
        (generated captions) and entries it adds to results.json."""
        return {}

    # -- a checkpoint, applied -----------------------------------------------------
    def module_from_extras(self, extras: Mapping[str, Any]) -> L.LightningModule:
        """A new module of a checkpoint's configuration and extras (before its weights)."""
        raise NotImplementedError

    def load_module(self, state_dict: Mapping[str, Any], extras: Mapping[str, Any], checkpoint: Any) -> L.LightningModule:
        """The module of a checkpoint, weights loaded, in eval mode; weights that do not fit
        the stored configuration are a ValueError naming the checkpoint."""
        module = self.module_from_extras(extras)
        try:
            module.load_state_dict(dict(state_dict))
        except RuntimeError as error:
            raise ValueError(f"{checkpoint}: the weights do not fit the stored configuration: {error}") from None
        return module.eval()

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | None = None, require_labels: bool = True,
                        **options: Any) -> TaskData:
        """The data a checkpoint is evaluated on (``require_labels``) or applied to:
        ``split`` (``all``: every row), ``source`` and ``modalities`` as ``polyfuse
        evaluate --data / --modalities`` (None when :attr:`reads_own_files`), and the
        :attr:`predict_options`."""
        raise NotImplementedError

    def loaders(self, data: TaskData, split: str) -> dict[str, DataLoader]:
        """The evaluation loaders of ``split``, by split name (``all`` may be one
        split or several)."""
        raise NotImplementedError

    def bind(self, module: L.LightningModule, data: TaskData, **options: Any) -> None:
        """Hand a loaded module what evaluation or prediction on ``data`` needs (reference
        captions, the number of answers to keep) before the trainer runs it."""

    def records(self, module: L.LightningModule, outputs: Mapping[str, Sequence[Any]], data: TaskData,
                extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Prediction records (one dict per row) from ``Trainer.predict``'s outputs per
        split (the keys of :meth:`loaders`)."""
        raise NotImplementedError

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        """Write ``records`` to ``path`` (atomically)."""
        raise NotImplementedError

    def attention_figures(self, module: L.LightningModule, extras: Mapping[str, Any], out: Path, *,
                          split: str, sample: int, source: str | None, modalities: Sequence[str] | None,
                          **options: Any) -> list[Path]:
        """The figures of the model's attention for the ``sample``-th item of ``split``
        (``polyfuse plot attention``), written to ``out``; ``options``: the
        :attr:`figure_options` the user gave. The default refuses in one line, naming the
        task types that have a figure."""
        raise ValueError(f"a {self.name} checkpoint has no attention figure; plot attention draws those of "
                         f"{', '.join(attention_task_types())}")

    def ranking_figure(self, module: L.LightningModule, extras: Mapping[str, Any], out: Path, *, split: str,
                       query: str | None, caption: int | None, top: int, clips: str | None) -> tuple[list[Path], list[str]]:
        """``polyfuse plot ranking``: the ``top`` items of ``split`` for one free-text
        ``query`` or for the ``caption``-th caption of the split (its own item marked),
        drawn to ``out`` (``clips``: a folder of the items' media); returns the files and
        the lines that say the ranking. The default refuses in one line, naming the task
        types that have the figure."""
        raise ValueError(f"a {self.name} checkpoint has no ranking figure; plot ranking draws those of "
                         f"{', '.join(ranking_task_types())}")

    # -- comparison ----------------------------------------------------------------
    def baselines(self, config: Mapping[str, Any], statistics: Sequence[str] = ("median", "mean")) -> dict[str, dict[str, float]]:
        """Test metrics of trivial predictors (``statistics``: the constant predictions of
        training medians, means), row name -> metrics, shown under a comparison's table;
        {} for none."""
        return {}

    def summary(self, summary: Sequence[Mapping[str, Any]], out_dir: Path) -> str | None:
        """The task's own markdown table for ``polyfuse compare`` (and figures it writes to
        ``out_dir``) from the mean ± std rows, or None for the engine's table."""
        return None


SpecType = TypeVar("SpecType", bound=type[TaskSpec])

_SPECS: dict[str, TaskSpec] = {}


def register_task(cls: SpecType) -> SpecType:
    """Class decorator: register one instance of a TaskSpec subclass under ``cls.name``."""
    name = cls.name
    if name in _SPECS and type(_SPECS[name]) is not cls:
        raise ValueError(f"task type {name!r} is already registered")
    _SPECS[name] = cls()
    return cls


def available_tasks() -> list[str]:
    """The registered task types, in registration order."""
    return list(_SPECS)


def attention_task_types() -> list[str]:
    """The registered task types whose spec draws an attention figure."""
    return [name for name, spec in _SPECS.items()
            if type(spec).attention_figures is not TaskSpec.attention_figures]


def ranking_task_types() -> list[str]:
    """The registered task types whose spec draws a ranking figure."""
    return [name for name, spec in _SPECS.items()
            if type(spec).ranking_figure is not TaskSpec.ranking_figure]


def task_specs() -> list[TaskSpec]:
    """Every registered spec."""
    return list(_SPECS.values())


def task_spec(name: str) -> TaskSpec:
    """The spec registered as ``name``; an unknown name says the closest known one."""
    if name not in _SPECS:
        close = difflib.get_close_matches(str(name), list(_SPECS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown task type {name!r}{hint}; expected one of {', '.join(_SPECS)}")
    return _SPECS[name]
