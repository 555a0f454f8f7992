"""A synthetic Flickr30k Entities set (:func:`polyfuse.data.synthetic_flickr30k.write_flickr30k_like`)
and its ``task.type grounding`` configuration: a small BAN attention map."""

from __future__ import annotations

from pathlib import Path

from tests.tiny import TRAINER

from polyfuse.data.synthetic_flickr30k import write_flickr30k_like


def grounding_config(folder: Path, *, images: int = 20, seed: int = 0, **ban) -> dict:
    """The release-format files of ``images`` images under ``folder / "flickr30k"`` and
    their configuration (``ban`` overrides keys of ``model.options.ban``)."""
    written = write_flickr30k_like(folder / "flickr30k", images=images, seed=seed, feature_dim=16)
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "grounding"},
        "data": {
            "batch_size": 8,
            "grounding": {"entities": str(written.folder), "features": str(written.features),
                          "features_index": str(written.index)},
        },
        "model": {
            "fusion": "ban",
            "grounding": {"hidden_dim": 8, "embedding_dim": 8},
            "options": {"ban": {"glimpses": 1, "k": 2, "dropout": 0.0, "attention_dropout": 0.0, **ban}},
        },
        "optim": {"lr": 0.01},
        "trainer": {"max_epochs": 10, "patience": 0, "num_threads": 1, "progress_bar": False, "quiet": True},
    }  # fmt: skip


def grounding_task_config(folder: Path) -> dict:
    """:func:`grounding_config` with dropout 0.2 and the tiny trainer section (:data:`tests.tiny.TRAINER`)."""
    config = grounding_config(folder, dropout=0.2)
    config["trainer"] = {**config["trainer"], **TRAINER}
    return config
