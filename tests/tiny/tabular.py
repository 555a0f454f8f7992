"""A tiny ``.npz`` file of two sequence modalities for the tabular task types
(``sentiment``, ``traits``, ``classification``): a label made of a product of the two
modalities, 36 / 12 / 12 samples in the train / valid / test split."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from tests.tiny import TRAINER


def tabular_config(kind: str) -> Callable[[Path], dict]:
    """The builder of task type ``kind``'s configuration: called with a folder, it writes
    ``tiny.npz`` there and returns a concat-fusion configuration that reads it."""

    def config(folder: Path) -> dict:
        rng = np.random.default_rng(0)
        a, b = rng.normal(size=(60, 4, 3)), rng.normal(size=(60, 5, 2))
        signal = a[:, :, 0].mean(1) * b[:, :, 1].mean(1)
        label = {"sentiment": np.clip(3 * signal, -3, 3), "traits": np.stack([signal, -signal], 1).clip(-1, 1) * 3 + 4,
                 "classification": np.digitize(signal, [-0.1, 0.1])}[kind]
        split = np.array(["train"] * 36 + ["val"] * 12 + ["test"] * 12)
        np.savez(folder / "tiny.npz", a=a.astype(np.float32), b=b.astype(np.float32), label=label, split=split)
        task = {"type": kind, **({"target_ranges": [[1, 7], [1, 7]]} if kind == "traits" else {})}
        return {
            "output_dir": str(folder / "runs"),
            "task": task,
            "data": {"source": str(folder / "tiny.npz"), "modalities": ["a", "b"], "split": "split", "batch_size": 12},
            "model": {"fusion": "concat", "fusion_dim": 8, "out_dim": 8, "dropout": 0.2, "encoder": {"hidden_dim": 8}},
            "trainer": dict(TRAINER),
        }

    return config
