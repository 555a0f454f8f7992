"""One tiny configuration per registered task type, for the tests that run every task
type (the task contract, data parallel, the commands on every task)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny.captioning import captioning_task_config
from tests.tiny.chimera import chimera_config
from tests.tiny.grounding import grounding_task_config
from tests.tiny.retrieval import retrieval_config
from tests.tiny.tabular import tabular_config
from tests.tiny.vqa import vqa_task_config

#: task type -> its tiny configuration (its files written under the given folder)
TINY: dict[str, Callable[[Path], dict]] = {
    "sentiment": tabular_config("sentiment"),
    "traits": tabular_config("traits"),
    "classification": tabular_config("classification"),
    "vqa": vqa_task_config,
    "captioning": captioning_task_config,
    "retrieval": retrieval_config,
    "chimera": chimera_config,
    "grounding": grounding_task_config,
}
