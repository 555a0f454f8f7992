"""The configuration schema (pydantic): every key, its type, range and default.

:class:`RunConfig` validates a whole configuration. Unknown keys are errors at
every level, with a did-you-mean. ``model.options`` is checked per fusion module
against a schema built from that module's constructor signature (names,
annotations, defaults), so options a module gains are picked up without editing
this file. docs/CONFIGURATION.md is generated from these classes
(``python scripts/config_reference.py``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from polyfuse import __version__
from polyfuse.sizes import MAX_SIZE, SizeInt, option_bound
from polyfuse.tasks.registry import available_tasks, task_spec, task_specs

__all__ = ["RunConfig", "format_errors", "fusion_option_model", "validate_config", "version_of"]

SEED_MAX = 2**32 - 1  # numpy's seeding range
MAX_BATCH = 1 << 20
PRECISIONS = ("32-true", "32", "64-true", "64", "bf16-mixed", "bf16-true", "bf16", "16-mixed", "16-true", "16")


def version_of(text: Any) -> Version:
    """A ``polyfuse_version`` as a version number (``0.4.0``, ``0.10.1rc1``); a ValueError if it is none."""
    try:
        return Version(str(text))
    except InvalidVersion:
        raise ValueError(f"polyfuse_version {text!r} is not a version such as {__version__}") from None


def _seed_range(value: int) -> int:
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"a seed must lie in [0, {SEED_MAX}]")
    return value


PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]


class _Section(BaseModel):
    # strict: no bool where a number goes, no "3" where an integer goes.
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


def _ordered_range(value: list[float]) -> list[float]:
    if not all(math.isfinite(v) for v in value) or not value[0] < value[1]:
        raise ValueError(f"a range is [low, high] with finite low < high, got {value}")
    return value


_Range = Annotated[list[float], Field(min_length=2, max_length=2), AfterValidator(_ordered_range)]


class TaskConfig(_Section):
    """What is predicted and how it is scored."""

    type: str = Field("sentiment", description="a registered task type (polyfuse.tasks.registry): sentiment | traits | classification | vqa | captioning | ...")
    loss: str = Field("l1", description="regression loss: l1 | mse | smooth_l1")
    target_names: list[str] | None = Field(None, description="traits: one name per target column")
    target_ranges: list[_Range] | dict[str, _Range] | None = Field(
        None,
        description="traits: [[low, high], ...] per label column, or {target name: [low, high]}; sentiment: "
        "[[low, high]] (default: the scale the data format documents, else for traits the training labels, "
        "with a warning); sets MA<c> (c = high - low + 1); labels outside are refused (see out_of_range)",
    )
    out_of_range: Literal["error", "clip"] = Field(
        "error", description="a label outside its configured or documented range: error (naming file and row) "
        "| clip (into the range, said in the run log)",
    )
    targets: list[str | int] | None = Field(
        None, description="traits: the label columns to predict, by target name or index (default: all)"
    )
    label_smoothing: Probability = Field(0.0, description="classification, captioning: label smoothing in [0, 1)")

    @field_validator("type", "loss")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        from polyfuse.tasks.base import LOSSES

        # Read at validation time: task types added to the registry are accepted.
        known, what = (available_tasks(), "task type") if info.field_name == "type" else (LOSSES, "loss")
        if value not in known:
            raise ValueError(f"unknown {what} {value!r}{_suggest(value, known)}; expected one of {', '.join(known)}")
        return value


class ContextConfig(_Section):
    """Contextual mode: windows of neighbouring rows of one recording."""

    group_by: str = Field(description="the array naming each row's recording (e.g. video_id)")
    order_by: str | None = Field(None, description="the array ordering rows within a recording (e.g. start)")
    window: Annotated[int, Field(ge=0)] | None = Field(None, description="rows per window (0 or null: whole recordings)")


class _DataConfigBase(_Section):
    """Where the features come from and how they are split and batched."""

    source: str | None = Field(None, description=".npz / .h5 path (relative to the config file), or synthetic:key=value,...")
    modalities: list[str] | None = Field(None, description="array names, in order (a comma-separated string works too)")
    label: str = Field("label", description="label array name")
    padding: Literal["left", "right", "auto"] = Field(
        "auto", description="left (CMU / MFN: zeros first) | right | auto (word-aligned directories: detected; "
        ".npz / .h5: real steps first, lengths arrays); left / right find the real steps from the zero padding"
    )
    split: str | None = Field(None, description="split array name (values train / val / test; valid, validation, dev read as val)")
    split_values: dict[Literal["train", "val", "test"], list[str | int]] | None = Field(
        None, description="which split values mean train / val / test"
    )
    group: str | None = Field(None, description="group array for carving held-out parts (default: context.group_by)")
    id: str | None = Field(None, description="id array written next to predictions")
    context: ContextConfig | None = Field(None, description="contextual mode {group_by, order_by, window}")
    validation_fraction: Fraction = Field(0.15, description="share of training groups carved out for validation, in (0, 1)")
    test_fraction: Fraction = Field(0.2, description="share of groups drawn for test, in (0, 1) (only without a split array)")
    split_seed: Annotated[int, AfterValidator(_seed_range)] = Field(0, description=f"seed of the carving draws, in [0, {SEED_MAX}]")
    standardize: bool = Field(True, description="standardise features with training statistics")
    nonfinite: Literal["error", "zero", "mean"] = Field("error", description="what to do with NaN / Inf features")
    batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] = Field(32, description="global training batch (all processes)")
    eval_batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH)] = Field(256, description="evaluation batch")
    loader_workers: Annotated[int, Field(ge=0, le=64)] | None = Field(
        None, description="data loader worker processes per process (null: chosen from the free cores, polyfuse.data.loading)"
    )

    @field_validator("modalities", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value


class EncoderConfig(_Section):
    """The per-modality encoder before fusion."""

    type: Literal["none", "linear", "gru"] = Field("linear", description="none | linear | gru")
    hidden_dim: SizeInt = Field(64, description="encoder output size")
    dropout: Probability = Field(0.1, description="encoder dropout in [0, 1)")


class _ModelConfigBase(_Section):
    """The fusion module and what surrounds it."""

    backbone: str = Field(
        "fusion", description="fusion (encoders + fusion) | a name of polyfuse.nn.backbones.available()"
    )
    fusion: str = Field(
        "man", description="a name of polyfuse.nn.available(); with a backbone: its extra module, or none"
    )
    fusion_dim: SizeInt = Field(64, description="fusion module out_dim")
    out_dim: SizeInt = Field(64, description="backbone output (after the projection)")
    dropout: Probability = Field(0.1, description="dropout after the projection, in [0, 1)")
    skip: bool = Field(True, description="concatenate each modality's own (centre) step to the fused vector")
    centre_marker: bool = Field(
        False, description="contextual mode: mark the centre step in every modality's input"
    )
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="encoder settings")
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="{fusion name: {constructor keyword: value}}; checked against the constructor"
    )
    input_groups: dict[str, list[list[str] | str]] = Field(
        default_factory=dict, description="{fusion name: [[modality, ...], ...]}: modalities concatenated per input"
    )

    @field_validator("backbone")
    @classmethod
    def _known_backbone(cls, value: str) -> str:
        known = ["fusion", *_backbone_names()]
        if value not in known:
            raise _KeyError(f"model.backbone: unknown backbone {value!r}{_suggest(value, known)}; known: {', '.join(known)}")
        return value

    @field_validator("fusion")
    @classmethod
    def _known_fusion(cls, value: str) -> str:
        # none: a backbone alone (checked in _fusion_needs_a_backbone); a task type's own
        # fusion names (TaskSpec.fusions) are checked against the task in _task_sections
        if value != "none" and value not in _task_fusions():
            _check_fusion_name(value, "model.fusion", also=sorted(_task_fusions()))
        return value

    @model_validator(mode="after")
    def _fusion_needs_a_backbone(self) -> _ModelConfigBase:
        if self.fusion == "none" and self.backbone == "fusion":
            raise ValueError("model.fusion: none needs a backbone (model.backbone: " + " or ".join(_backbone_names()) + ")")
        return self

    @field_validator("input_groups")
    @classmethod
    def _known_group_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            _check_fusion_name(name, "model.input_groups")
        return value

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, options in value.items():
            if name in _backbone_names():  # a backbone's options: checked where it is built
                continue
            _check_fusion_name(name, "model.options")
            schema = fusion_option_model(name)
            try:
                schema.model_validate(options)
            except ValidationError as error:
                raise _KeyError(format_errors(error, ("model", "options", name), model=schema)) from None
        return value


class OptimConfig(_Section):
    """The optimiser (AdamW, Adam or ban-vqa's Adamax) and its schedule, for every task type (polyfuse.tasks.optim)."""

    optimizer: Literal["adamw", "adam", "adamax"] = Field(
        "adamw", description="adamw | adam (torch Adam: Low-Rank HOCA, MAN retrieval, Chimera) | adamax (ban-vqa's)"
    )
    lr: Annotated[float, Field(ge=0.0)] = Field(1e-3, description="learning rate (the base of the schedule; a task's own groups, e.g. retrieval.text_lr, keep theirs)")
    weight_decay: Annotated[float, Field(ge=0.0)] = Field(
        0.0, description="weight decay (AdamW: decoupled; Adam, Adamax: an L2 term); biases exempt in the tabular and vqa tasks, not in captioning, retrieval, chimera"
    )
    scheduler: Literal["none", "cosine", "ban_warmup", "step"] = Field(
        "none", description="none | cosine (annealing over max_epochs, per epoch) | ban_warmup (ban-vqa, per epoch: lr x 0.5, 1, 1.5, 2 in epochs 0-3, x 0.25 at epochs 10, 12, 14, 16, 18) | step (lr x decay_rate every decay_every optimizer steps)"
    )
    decay_rate: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        None, description="scheduler: step: the factor, in (0, 1] (MAN retrieval, Collaborative Experts: 0.95)"
    )
    decay_every: Annotated[int, Field(ge=1)] | None = Field(
        None, description="scheduler: step: optimizer steps between decays, >= 1 (MAN retrieval, Collaborative Experts: 1000)"
    )

    @model_validator(mode="after")
    def _step_decay(self) -> OptimConfig:
        for key in ("decay_rate", "decay_every"):
            given = getattr(self, key) is not None
            if self.scheduler == "step" and not given:
                raise _KeyError(f"optim.{key}: optim.scheduler step needs it (lr x decay_rate every decay_every optimizer steps)")
            if self.scheduler != "step" and given:
                raise _KeyError(f"optim.{key} is read only by optim.scheduler step (scheduler is {self.scheduler!r}); remove it")
        return self


class TrainerConfig(_Section):
    """Lightning trainer settings."""

    max_epochs: PositiveInt = Field(30, description="maximum number of epochs")
    min_epochs: PositiveInt = Field(1, description="minimum number of epochs")
    patience: Annotated[int, Field(ge=0)] = Field(10, description="early stopping on the monitored metric; 0 disables")
    monitor: str | None = Field(None, description="validation metric val/... (default: val/mae regression, val/loss classification)")
    mode: Literal["min", "max"] | None = Field(None, description="min | max (default from the monitor)")
    accelerator: str = Field("auto", description="cpu | gpu | auto")
    devices: PositiveInt = Field(1, description="processes (data parallel) or accelerators, per machine")
    num_nodes: PositiveInt = Field(1, description="machines of a data-parallel run, devices processes on each (started by torchrun or SLURM's srun: docs/TRAINING.md)")
    strategy: str = Field("auto", description="Lightning strategy: auto, ddp (gloo on CPU), ...")
    precision: Literal[PRECISIONS] = Field("32-true", description="Lightning precision, e.g. 32-true or bf16-mixed")  # type: ignore[valid-type]
    gradient_clip_val: Annotated[float, Field(gt=0.0)] | None = Field(None, description="clip gradient norms to this value (> 0)")
    deterministic: bool = Field(True, description="deterministic algorithms")
    progress_bar: bool = Field(True, description="show the progress bar")
    log_every_n_steps: PositiveInt = Field(10, description="logging interval in steps")
    num_threads: Annotated[int, Field(ge=1, le=4096)] | None = Field(None, description="torch intra-op CPU threads per process (default: the free cores divided among the processes, less one inter-op thread each)")
    quiet: bool = Field(False, description="hide Lightning's info messages (the CLI's --quiet also hides the progress bar)")

    @field_validator("monitor")
    @classmethod
    def _validation_metric(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("val/"):
            raise ValueError(f"must be a validation metric (val/...), got {value!r}")
        return value


class _RunConfigBase(_Section):
    """A whole run configuration."""

    name: str | None = Field(None, description="run name: the directory under output_dir (default: config file name)")
    polyfuse_version: str | None = Field(
        None, description="the polyfuse version the configuration was written for (none: this one); a run records "
        "the version that trained it. Before 0.4.0: refused, with how to retrain (CHANGELOG.md)",
    )
    seed: Annotated[int, AfterValidator(_seed_range)] = Field(0, description=f"seed of initialisation, shuffling and dropout, in [0, {SEED_MAX}]")
    output_dir: str = Field("runs", description="where runs are written (relative to the config file when set there)")
    task: TaskConfig = Field(default_factory=TaskConfig, description="task section")
    data: _DataConfigBase = Field(default_factory=_DataConfigBase, description="data section")
    model: _ModelConfigBase = Field(default_factory=_ModelConfigBase, description="model section")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optim section")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="trainer section")

    @field_validator("polyfuse_version")
    @classmethod
    def _a_version(cls, value: str | None) -> str | None:
        if value is not None:
            version_of(value)
        return value

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        from polyfuse.engine.rundir import safe_run_name

        return None if value is None else safe_run_name(value)

    @model_validator(mode="after")
    def _epochs(self) -> _RunConfigBase:
        if self.trainer.min_epochs > self.trainer.max_epochs:
            raise ValueError(
                f"trainer.min_epochs ({self.trainer.min_epochs}) exceeds trainer.max_epochs ({self.trainer.max_epochs})"
            )
        return self

    @model_validator(mode="after")
    def _task_sections(self) -> _RunConfigBase:
        """The sections of another task type are refused, the task's required ones
        demanded; then the task's own rules (:meth:`~polyfuse.tasks.registry.TaskSpec.check_config`)."""
        spec = task_spec(self.task.type)
        for other in task_specs():
            for path in other.sections:
                if path not in spec.sections and _section_at(self, path) is not None:
                    raise ValueError(f"{path} is only used by task.type {other.name} (task.type is {self.task.type!r})")
        for path in spec.required_sections:
            if _section_at(self, path) is None:
                raise ValueError(f"task.type {spec.name} needs a {path} section")
        fusion = self.model.fusion
        if spec.fusions is not None and fusion not in spec.fusions:
            raise _KeyError(f"model.fusion: task.type {spec.name} takes {' | '.join(spec.fusions)}, not {fusion!r}"
                            f"{_suggest(fusion, spec.fusions)}")
        if spec.fusions is None and fusion != "none":
            _check_fusion_name(fusion, "model.fusion")
        spec.check_config(self)
        return self


def _section_at(config: BaseModel, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def _summary(section: type, spec_name: str) -> str:
    summary = (section.__doc__ or "").strip().splitlines()[0] if section.__doc__ else ""
    return f"task.type {spec_name}: " + re.sub(r"\s*\(task\.type \w+\)", "", summary).rstrip(".")


def _task_fields(prefix: str) -> dict[str, Any]:
    """The optional sections the registered task types add under ``prefix`` ("" for the
    top level, "data." for ``data.vqa``): :attr:`~polyfuse.tasks.registry.TaskSpec.config_sections`."""
    fields: dict[str, Any] = {}
    for spec in task_specs():
        for path, section in spec.config_sections.items():
            head, _, name = path.rpartition(".")
            if (head + "." if head else "") == prefix:
                fields[name] = (section | None, Field(None, description=_summary(section, spec.name)))
    return fields


def _with_task_sections(base: type[BaseModel], name: str, prefix: str) -> type[BaseModel]:
    return create_model(name, __base__=base, __doc__=base.__doc__, **_task_fields(prefix))


DataConfig = _with_task_sections(_DataConfigBase, "DataConfig", "data.")
ModelConfig = _with_task_sections(_ModelConfigBase, "ModelConfig", "model.")


def _run_config() -> type[BaseModel]:
    """RunConfig: the shared sections and, optional, the sections of every registered
    task type (:attr:`~polyfuse.tasks.registry.TaskSpec.config_sections`)."""
    return create_model(
        "RunConfig", __base__=_RunConfigBase, __doc__=_RunConfigBase.__doc__,
        data=(DataConfig, Field(default_factory=DataConfig, description="data section")),
        model=(ModelConfig, Field(default_factory=ModelConfig, description="model section")),
        **_task_fields(""),
    )


RunConfig = _run_config()


class _KeyError(ValueError):
    """An error whose message is complete (names its key): passed through as it is."""


def _suggest(value: str, known: Any) -> str:
    close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _backbone_names() -> list[str]:
    import polyfuse.nn.backbones

    return polyfuse.nn.backbones.available()


def _task_fusions() -> set[str]:
    """The fusion names that task types declare beyond polyfuse.nn's modules."""
    return {name for spec in task_specs() for name in (spec.fusions or ())}


def _check_fusion_name(name: str, where: str, also: Sequence[str] = ()) -> None:
    """``name`` is a fusion module of polyfuse.nn (or one of ``also``: task types' own fusions)."""
    import polyfuse.nn

    known = polyfuse.nn.available()
    if name not in known:
        others = f"; task types' own: {', '.join(also)}" if also else ""
        raise _KeyError(f"{where}: unknown fusion module {name!r}{_suggest(name, [*known, *also])}; "
                        f"known: {', '.join(known)}{others}")


_NOT_OPTIONS = ("self", "input_dims", "out_dim")


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(arg) for arg in typing.get_args(annotation))


class _Options(BaseModel):
    # lax: lists where a constructor takes tuples; bools are refused by hand below.
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and isinstance(value, bool) and not _admits_bool(field.annotation):
            raise ValueError(f"got a boolean where {_type_name(field.annotation)} goes")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _sizes_are_bounded(cls, value: Any, info: ValidationInfo) -> Any:
        bound = option_bound(info.field_name or "")
        numbers = value if isinstance(value, (list, tuple)) else [value]
        for number in numbers:
            if isinstance(number, int) and not isinstance(number, bool) and number > bound:
                raise ValueError(
                    f"{number} is over the bound of {bound}"
                    f"{' on sizes (polyfuse.sizes.MAX_SIZE)' if bound == MAX_SIZE else ''}"
                )
        return value


# Options that the engine translates before they reach a constructor: their config type.
# sequence_modalities (TFN, LMF) takes modality names as well as indices (engine/build.py).
_CONFIG_ANNOTATIONS: dict[str, Any] = {"sequence_modalities": list[int | str] | None}


@functools.cache
def fusion_option_model(name: str) -> type[BaseModel]:
    """A schema of the keyword options of the fusion module ``name``, from its constructor."""
    import polyfuse.nn

    cls = polyfuse.nn.get(name)
    signature = inspect.signature(cls.__init__)
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that cannot be resolved: accept any value for it
        hints = {}
    fields: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.name in _NOT_OPTIONS or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = _CONFIG_ANNOTATIONS.get(parameter.name, hints.get(parameter.name, Any))
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    return create_model(f"{cls.__name__}Options", __base__=_Options, __doc__=f"Options of {cls.__name__}.", **fields)


def _known_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) model that holds the key at ``loc``."""
    current: Any = model
    for part in loc[:-1]:
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *typing.get_args(annotation)]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(current.model_fields) if current is not None else []


_TYPE_TAGS = {"int", "str", "float", "bool", "list", "dict", "tuple", "nullable", "literal", "none"}


def _is_key(part: Any) -> bool:
    """A location part that is a config key or list index, not a pydantic type tag."""
    return isinstance(part, int) or (str(part).isidentifier() and str(part) not in _TYPE_TAGS)


def format_errors(error: ValidationError, prefix: tuple[str, ...] = (), model: type[BaseModel] | None = None) -> str:
    """One line per problem: the dotted key, what is wrong, the value given, did-you-mean."""
    lines = []
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"] if _is_key(part))
        dotted = ".".join((*prefix, *loc))
        if item["type"] == "extra_forbidden":
            known = _known_at(model or error_model(error), loc) if model or error_model(error) else []
            hint = _suggest(loc[-1], known) if known else ""
            where = ".".join((*prefix, *loc[:-1]))
            lines.append(
                f"unknown config key {dotted!r}{hint}; known keys{' under ' + repr(where) if where else ''}: "
                f"{', '.join(sorted(known))}"
            )
            continue
        message = str(item["msg"]).removeprefix("Value error, ")
        cause = (item.get("ctx") or {}).get("error")
        if item["type"] == "missing":
            lines.append(f"config key {dotted!r} is required")
        elif isinstance(cause, _KeyError):
            lines.append(str(cause))
        else:
            lines.append(f"config key {dotted!r}: {message} (got {item.get('input')!r})" if dotted else message)
    return "; ".join(dict.fromkeys(lines))


def error_model(error: ValidationError) -> type[BaseModel] | None:
    """The model class a validation error came from (by its title)."""
    for model in (RunConfig, TaskConfig, DataConfig, ContextConfig, ModelConfig, EncoderConfig, OptimConfig, TrainerConfig,
                  *(section for spec in task_specs() for section in spec.config_sections.values())):
        if model.__name__ == error.title:
            return model
    return None


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration with defaults filled in, or ValueError naming every problem."""
    try:
        validated = RunConfig.model_validate(dict(config))
    except ValidationError as error:
        raise ValueError(format_errors(error, model=RunConfig)) from None
    return validated.model_dump()
