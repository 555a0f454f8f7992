"""The three tasks over arrays of features per modality and one label per row:
sentiment regression (MOSI), multi-target traits (POM), classification.

Each is a Lightning module (a head, a loss and metrics on a passed-in backbone) and a
registered :class:`~polyfuse.tasks.registry.TaskSpec`: its data are an ``.npz`` / ``.h5``
file, a word-aligned folder or ``synthetic:`` (``data.source``, docs/TRAINING.md);
its checkpoints store the modalities, feature sizes, label encoding and the training
statistics of the features.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from polyfuse.atomic import write_csv
from polyfuse.data import FeatureStats, TabularData, load_source, prepare_data
from polyfuse.data.datamodule import FusionDataModule
from polyfuse.data.loading import loader_options
from polyfuse.data.sources import is_synthetic, synthetic_modalities
from polyfuse.metrics import (
    ClassificationMetrics,
    SentimentMetrics,
    TraitMetrics,
    metric_values,
    sentiment_metrics,
    trait_metrics,
)
from polyfuse.tasks.base import LOSSES, FusionTask
from polyfuse.tasks.building import build_backbone
from polyfuse.tasks.registry import TaskData, TaskSpec, register_task

__all__ = [
    "CONSTANT_ROWS",
    "ClassificationSpec",
    "ClassificationTask",
    "SentimentSpec",
    "SentimentTask",
    "TabularSpec",
    "TraitsSpec",
    "TraitsTask",
    "prepared_data",
]

def _regression_loss(name: str):
    if name not in LOSSES:
        raise ValueError(f"unknown regression loss {name!r}; expected one of {', '.join(LOSSES)}")
    return LOSSES[name]


class SentimentTask(FusionTask):
    """One score per sample (MOSI: [-3, 3]); L1 loss by default; MOSI metrics."""

    task_type = "sentiment"
    default_monitor = ("val/mae", "min")

    def __init__(self, backbone: nn.Module, *, loss: str = "l1", **options) -> None:
        self.loss_function = _regression_loss(loss)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return 1

    def make_metrics(self) -> Metric:
        return SentimentMetrics()

    def predictions(self, outputs: Tensor) -> Tensor:
        return outputs[:, 0]

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return self.loss_function(outputs[:, 0], target.float())


class TraitsTask(FusionTask):
    """k scores per sample (POM speaker traits); per-target MAE and MA5 / MA7."""

    task_type = "traits"
    default_monitor = ("val/mae", "min")

    def __init__(
        self, backbone: nn.Module, *, names: Sequence[str], ranges: Sequence[Sequence[float]],
        loss: str = "l1", **options,
    ) -> None:
        self.names = list(names)
        self.ranges = [list(r) for r in ranges]
        self.loss_function = _regression_loss(loss)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return len(self.names)

    def make_metrics(self) -> Metric:
        return TraitMetrics(self.ranges, self.names)

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return self.loss_function(outputs, target.float())


class ClassificationTask(FusionTask):
    """One of C classes per sample; cross-entropy; accuracy and macro F1."""

    task_type = "classification"
    default_monitor = ("val/loss", "min")

    def __init__(self, backbone: nn.Module, *, num_classes: int, label_smoothing: float = 0.0, **options) -> None:
        if num_classes < 2:
            raise ValueError(f"classification needs at least 2 classes, got {num_classes}")
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)
        super().__init__(backbone, **options)

    @property
    def output_size(self) -> int:
        return self.num_classes

    def make_metrics(self) -> Metric:
        return ClassificationMetrics(self.num_classes)

    def predictions(self, outputs: Tensor) -> Tensor:
        return outputs.softmax(dim=-1)

    def compute_loss(self, outputs: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(outputs, target.long(), label_smoothing=self.label_smoothing)


def prepared_data(
    config: Mapping[str, Any],
    label_kind: str,
    *,
    source: str | None = None,
    stats: Mapping[str, FeatureStats] | None = None,
    label_info: Mapping[str, Any] | None = None,
    splits: Sequence[str] | None = None,
    require_labels: bool = True,
    base: str | Path | None = None,
) -> TabularData:
    """Load the data source (``source`` overrides ``data.source``) and prepare it."""
    data = dict(config["data"])
    data["source"] = source or data["source"]
    table = load_source(
        data["source"], base=base, padding=data.get("padding", "auto"), modalities=data.get("modalities") or None
    )
    if not data.get("modalities") and is_synthetic(data["source"]):
        data["modalities"] = synthetic_modalities(data["source"])
        if data.get("split") is None:
            data["split"] = "split"
    if table.modalities:  # a word-aligned directory: the modalities it holds, its own split
        data["modalities"] = data.get("modalities") or list(table.modalities)
        if data.get("split") is None:
            data["split"] = "split"
    return prepare_data(
        table, data, config["task"], label_kind=label_kind, stats=stats, label_info=label_info,
        splits=splits, require_labels=require_labels,
    )


def _stats_to_tensors(stats: Mapping[str, FeatureStats]) -> dict[str, dict[str, Tensor]]:
    return {name: {"mean": torch.from_numpy(s.mean), "std": torch.from_numpy(s.std)} for name, s in stats.items()}


def _stats_from_tensors(stored: Mapping[str, Mapping[str, Tensor]]) -> dict[str, FeatureStats]:
    return {name: FeatureStats(s["mean"].numpy(), s["std"].numpy()) for name, s in stored.items()}


def _split_key(data: TabularData, split: str) -> str:
    if split not in data.splits:
        raise ValueError(f"no {split!r} split; have {', '.join(data.splits)}")
    if not len(data.splits[split]):
        others = [key for key, rows in data.splits.items() if len(rows)]
        raise ValueError(
            f"the {split!r} split of {data.origin} has no rows; "
            f"choose --split all or one of: {', '.join(others) or '(none)'}"
        )
    return split


#: The rows of constant predictions in a comparison table (:meth:`TabularSpec.baselines`).
CONSTANT_ROWS = {"median": "constant (train median)", "mean": "constant (train mean)"}


class TabularSpec(TaskSpec):
    """What the three tasks over feature arrays share; a subclass sets the task class,
    the label kind (:data:`polyfuse.data.prepare.LABEL_KINDS`) and the records of a row."""

    task: ClassVar[type[FusionTask]]
    label_kind: ClassVar[str]

    @property
    def default_monitor(self) -> tuple[str, str]:  # type: ignore[override]
        return self.task.default_monitor

    def task_options(self, config: Mapping[str, Any], label_info: Mapping[str, Any]) -> dict[str, Any]:
        """The task class's own keyword arguments (loss, targets, classes)."""
        return {}

    def module_for(self, config: Mapping[str, Any], input_dims: Sequence[int], names: Sequence[str],
                label_info: Mapping[str, Any]) -> FusionTask:
        options: dict[str, Any] = {
            "lr": config["optim"]["lr"],
            "weight_decay": config["optim"]["weight_decay"],
            "scheduler": config["optim"]["scheduler"],
            "optimizer": config["optim"]["optimizer"],
            "max_epochs": config["trainer"]["max_epochs"],
            "decay_rate": config["optim"].get("decay_rate"),
            "decay_every": config["optim"].get("decay_every"),
            **self.task_options(config, label_info),
        }
        return self.task(build_backbone(config, input_dims, names), **options)

    def build_data(self, config: Mapping[str, Any]) -> TaskData[TabularData]:
        data = prepared_data(config, self.label_kind)
        if not len(data.splits["val"]):
            raise ValueError("the validation split is empty")
        batch_size = config["data"]["batch_size"]
        datamodule = FusionDataModule(
            data, batch_size=batch_size, eval_batch_size=config["data"]["eval_batch_size"], seed=int(config["seed"]),
            loader_options=loader_options(config),
        )
        samples = {key: len(p) for key, p in data.splits.items()}
        return TaskData(datamodule, data, samples, -(-len(data.splits["train"]) // batch_size))

    def build_module(self, config: Mapping[str, Any], data: TaskData[TabularData]) -> FusionTask:
        prepared = data.prepared
        return self.module_for(config, prepared.input_dims, prepared.modalities, prepared.label_info)

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[TabularData]) -> dict[str, Any]:
        prepared = data.prepared
        return {
            "config": dict(config),
            "modalities": prepared.modalities,
            "input_dims": prepared.input_dims,
            "label_info": prepared.label_info,
            "stats": _stats_to_tensors(prepared.stats),
        }

    def module_from_extras(self, extras: Mapping[str, Any]) -> FusionTask:
        return self.module_for(extras["config"], extras["input_dims"], extras["modalities"], extras["label_info"])

    def checkpoint_data(self, extras: Mapping[str, Any], *, split: str, source: str | None = None,
                        modalities: Sequence[str] | str | None = None, require_labels: bool = True,
                        **options: Any) -> TaskData[TabularData]:
        """The data a checkpoint is applied to. ``modalities``: the arrays of ``source`` that
        stand for the checkpoint's modalities, in its order (e.g. a checkpoint trained on
        ``synthetic:`` data applied to an npz file whose arrays have other names)."""
        config = extras["config"]
        trained = list(extras["modalities"])
        if modalities is not None:
            names = modalities.split(",") if isinstance(modalities, str) else modalities
            modalities = [m.strip() for m in names if m.strip()]
            if len(modalities) != len(trained):
                raise ValueError(
                    f"--modalities names {len(modalities)} arrays {modalities}; the checkpoint was trained "
                    f"on {len(trained)} modalities {trained}"
                )
            config = {**config, "data": {**config["data"], "modalities": modalities}}
        elif source is not None and config["data"]["modalities"] is None:
            config = {**config, "data": {**config["data"], "modalities": trained}}
        stats = _stats_from_tensors(extras["stats"])
        wanted = modalities or trained
        stats = {new: stats[old] for new, old in zip(wanted, trained, strict=True) if old in stats}
        data = prepared_data(
            config, self.label_kind, source=source, stats=stats, label_info=extras["label_info"],
            splits=["all"] if split == "all" else None, require_labels=require_labels,
        )
        if data.modalities != list(wanted):
            raise ValueError(
                f"the data has modalities {data.modalities}, the checkpoint {trained}; "
                "name the arrays to use with --modalities"
            )
        if list(data.input_dims) != list(extras["input_dims"]):
            raise ValueError(
                f"the modalities {data.modalities} have feature sizes {data.input_dims}; the checkpoint "
                f"was trained on sizes {list(extras['input_dims'])}"
            )
        _split_key(data, split)
        datamodule = FusionDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
        return TaskData(datamodule, data, {key: len(p) for key, p in data.splits.items()})

    def loaders(self, data: TaskData[TabularData], split: str) -> dict[str, Any]:
        key = _split_key(data.prepared, split)
        return {key: data.datamodule.loader(key)}

    def bind(self, module: Any, data: TaskData[TabularData], **options: Any) -> None:
        module.stage_metrics["test"].reset()

    def row_record(self, record: dict[str, Any], prediction: np.ndarray, data: TabularData, row: int,
                   info: Mapping[str, Any]) -> None:
        """Add a row's prediction (and label, when known) to its record."""
        raise NotImplementedError

    def attention_figures(self, module: Any, extras: Mapping[str, Any], out: Path, *, split: str, sample: int,
                          source: str | None, modalities: Sequence[str] | None) -> list[Path]:
        """The fusion's attention for one sample (MAN's marginals, BAN's maps)."""
        from polyfuse.tasks.attention_figure import tabular_attention_figure

        data = self.checkpoint_data(extras, split=split, source=source, modalities=modalities, require_labels=False)
        batch = data.datamodule.sample(_split_key(data.prepared, split), sample)
        return [tabular_attention_figure(module, batch, out, split=split, sample=sample)]

    def records(self, module: Any, outputs: Mapping[str, Sequence[Any]], data: TaskData[TabularData], extras: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``row``, ``id`` (when ``data.id`` names an array), the prediction and the label when known."""
        prepared = data.prepared
        batches = [batch for part in outputs.values() for batch in part]
        rows = torch.cat([o["row"] for o in batches]).numpy()
        predictions = torch.cat([o["prediction"] for o in batches]).numpy()
        records = []
        for i, row in enumerate(rows.tolist()):
            record: dict[str, Any] = {"row": row}
            if prepared.ids is not None:
                record["id"] = prepared.ids[row].item()
            self.row_record(record, predictions[i], prepared, row, extras["label_info"])
            records.append(record)
        return records

    def write_records(self, records: Sequence[Mapping[str, Any]], path: Path) -> None:
        write_csv(Path(path), records, list(records[0]) if records else ["row"])

    def baselines(self, config: Mapping[str, Any], statistics: Sequence[str] = ("median", "mean")) -> dict[str, dict[str, float]]:
        """Test metrics of constant predictions, row name (:data:`CONSTANT_ROWS`) -> metrics:
        the floor that MAE and multi-class accuracy of a weak-signal dataset must be read
        against. The training median of each target minimises the training MAE of a
        constant, the training mean its MSE, so a table of MAE shows the median's row: the
        mean's would flatter every model. Where the two are equal for every target, one
        row ``constant (train mean = median)``. {} for classification."""
        unknown = [s for s in statistics if s not in CONSTANT_ROWS]
        if unknown:
            raise ValueError(f"unknown constant {unknown[0]!r}; expected one of {', '.join(CONSTANT_ROWS)}")
        data = prepared_data(config, self.label_kind, splits=["train", "test"])
        targets = torch.from_numpy(data.targets).double()
        train, test = (torch.from_numpy(data.splits[p].rows) for p in ("train", "test"))
        # torch.median returns the lower of the two middle values; the mean of both is the usual median
        constants = {
            "mean": targets[train].mean(dim=0, keepdim=True),
            "median": torch.from_numpy(np.median(targets[train].numpy(), axis=0, keepdims=True)),
        }
        chosen = {CONSTANT_ROWS[statistic]: statistic for statistic in statistics}
        if set(statistics) == {"mean", "median"} and torch.equal(constants["mean"], constants["median"]):
            chosen = {"constant (train mean = median)": "mean"}
        rows: dict[str, dict[str, float]] = {}
        for name, statistic in chosen.items():
            constant = constants[statistic].float().expand(len(test), *targets.shape[1:]).contiguous()
            rows[name] = metric_values(self.constant_metrics(constant, targets[test].float(), data.label_info))
        return rows

    def constant_metrics(self, constant: Tensor, actual: Tensor, info: Mapping[str, Any]) -> dict[str, Tensor]:
        raise NotImplementedError


@register_task
class SentimentSpec(TabularSpec):
    name = "sentiment"
    task = SentimentTask
    label_kind = "score"

    def task_options(self, config: Mapping[str, Any], label_info: Mapping[str, Any]) -> dict[str, Any]:
        return {"loss": config["task"]["loss"]}

    def row_record(self, record, prediction, data, row, info) -> None:
        record["prediction"] = float(prediction)
        if data.targets is not None:
            record["label"] = float(data.targets[row])

    def constant_metrics(self, constant: Tensor, actual: Tensor, info: Mapping[str, Any]) -> dict[str, Tensor]:
        with warnings.catch_warnings():  # torchmetrics warns of the zero variance, corr is NaN anyway
            warnings.filterwarnings("ignore", message=r".*variance of predictions or target is close to zero.*")
            values = sentiment_metrics(constant, actual)
        values["corr"] = torch.tensor(float("nan"))  # undefined for a constant prediction
        return values


@register_task
class TraitsSpec(TabularSpec):
    name = "traits"
    task = TraitsTask
    label_kind = "scores"

    def task_options(self, config: Mapping[str, Any], label_info: Mapping[str, Any]) -> dict[str, Any]:
        return {"loss": config["task"]["loss"], "names": label_info["names"], "ranges": label_info["ranges"]}

    def row_record(self, record, prediction, data, row, info) -> None:
        for j, name in enumerate(info["names"]):
            record[f"prediction_{name}"] = float(prediction[j])
        if data.targets is not None:
            for j, name in enumerate(info["names"]):
                record[f"label_{name}"] = float(data.targets[row, j])

    def constant_metrics(self, constant: Tensor, actual: Tensor, info: Mapping[str, Any]) -> dict[str, Tensor]:
        return trait_metrics(constant, actual, ranges=info["ranges"], names=info["names"])


@register_task
class ClassificationSpec(TabularSpec):
    name = "classification"
    task = ClassificationTask
    label_kind = "class"

    def task_options(self, config: Mapping[str, Any], label_info: Mapping[str, Any]) -> dict[str, Any]:
        return {"num_classes": len(label_info["classes"]), "label_smoothing": float(config["task"]["label_smoothing"])}

    def row_record(self, record, prediction, data, row, info) -> None:
        classes = info["classes"]
        record["prediction"] = classes[int(prediction.argmax())]
        for c, value in enumerate(classes):
            record[f"prob_{value}"] = float(prediction[c])
        if data.targets is not None and data.targets[row] >= 0:
            record["label"] = classes[int(data.targets[row])]

    def baselines(self, config: Mapping[str, Any], statistics: Sequence[str] = ("median", "mean")) -> dict[str, dict[str, float]]:
        return {}
