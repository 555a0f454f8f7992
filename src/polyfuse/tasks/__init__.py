"""Tasks: Lightning modules that put a head, a loss and metrics on a passed-in model."""

# moved to polyfuse.nn.backbones; kept for 0.3.x (docs/TRAINING.md builds FusionBackbone by hand)
from polyfuse.nn.backbones.fusion import ENCODER_TYPES, FusionBackbone, ModalityEncoder
from polyfuse.tasks.base import SCHEDULERS, FusionTask
from polyfuse.tasks.captioning import CaptioningTask
from polyfuse.tasks.tasks import (
    LOSSES,
    TASKS,
    ClassificationTask,
    SentimentTask,
    TraitsTask,
    task_class,
)
from polyfuse.tasks.vqa import VQATask

TASKS["vqa"] = VQATask  # task.type vqa: its own data and model sections (engine/vqa_run.py)

TASKS["captioning"] = CaptioningTask  # type: ignore[assignment]  # its own engine path (engine/captioning_runs.py)

__all__ = [
    "ENCODER_TYPES",
    "LOSSES",
    "SCHEDULERS",
    "TASKS",
    "CaptioningTask",
    "ClassificationTask",
    "FusionBackbone",
    "FusionTask",
    "ModalityEncoder",
    "SentimentTask",
    "TraitsTask",
    "VQATask",
    "task_class",
]
