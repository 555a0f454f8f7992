"""Task types: one file each, with its Lightning module (a head, a loss and metrics on a
passed-in model) and its registered spec (:mod:`polyfuse.tasks.registry`)."""

# moved to polyfuse.nn.backbones; kept for 0.3.x (docs/TRAINING.md builds FusionBackbone by hand)
from polyfuse.nn.backbones.fusion import ENCODER_TYPES, FusionBackbone, ModalityEncoder
from polyfuse.tasks import chimera, retrieval  # noqa: F401  # register task.type chimera, retrieval
from polyfuse.tasks.base import SCHEDULERS, FusionTask
from polyfuse.tasks.captioning import CaptioningTask
from polyfuse.tasks.registry import (
    TaskData,
    TaskSpec,
    available_tasks,
    register_task,
    task_spec,
    task_specs,
)
from polyfuse.tasks.tabular import (
    LOSSES,
    ClassificationTask,
    SentimentTask,
    TraitsTask,
)
from polyfuse.tasks.vqa import VQATask

__all__ = [
    "ENCODER_TYPES",
    "LOSSES",
    "SCHEDULERS",
    "CaptioningTask",
    "ClassificationTask",
    "FusionBackbone",
    "FusionTask",
    "ModalityEncoder",
    "SentimentTask",
    "TaskData",
    "TaskSpec",
    "TraitsTask",
    "VQATask",
    "available_tasks",
    "register_task",
    "task_spec",
    "task_specs",
]
