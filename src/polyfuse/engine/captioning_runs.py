"""Training, evaluation and prediction runs of ``task.type: captioning``.

The engine's :func:`polyfuse.engine.run.train`, ``evaluate`` and ``predict`` hand
captioning configurations and checkpoints to this module. A training run writes
what every run writes (config.yaml, checkpoints/best and last, csv and tensorboard
logs, results.json, learning_curves.png) and, beside them, ``test_captions.json``:
the caption generated for every test video by the best checkpoint, and the
metrics' details (tokeniser, METEOR errors).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from polyfuse.data.captioning import CaptioningData, CaptioningDataModule, prepare_captioning
from polyfuse.engine.build import build_trainer, monitor_of
from polyfuse.engine.captioning_schema import variant_settings
from polyfuse.engine.checkpoints import (
    check_finite_state,
    checkpoint_epoch,
    load_state,
    read_checkpoint,
)
from polyfuse.engine.compat import defaults_then, warn_default_changes
from polyfuse.engine.config import dump_config, resolve_config
from polyfuse.engine.errors import RunInterrupted
from polyfuse.engine.rundir import atomic_write_text
from polyfuse.engine.seeding import seed_everything
from polyfuse.tasks.captioning import CaptioningTask, VideoCaptioner

__all__ = [
    "build_captioning_data",
    "build_captioning_task",
    "checkpoint_captioning_data",
    "evaluate_captioning",
    "initialise_word_embeddings",
    "is_captioning_checkpoint",
    "load_captioning_model",
    "predict_captioning",
    "reference_oov",
    "train_captioning",
]


def build_captioning_data(config: Mapping[str, Any], vocabulary: Sequence[str] | None = None) -> CaptioningData:
    section = config["captioning"]
    return prepare_captioning(
        section["features"], section["captions"], section["splits"], frame_stride=section["frame_stride"],
        missing_features=section["missing_features"], min_count=section["min_count"],
        max_words=section["max_words"], vocabulary=vocabulary, standardize=section["standardize"],
    )


def build_captioning_task(
    config: Mapping[str, Any], input_dims: Sequence[int], max_lengths: Sequence[int], vocabulary: Any
) -> CaptioningTask:
    decoder, section = config["decoder"], config["captioning"]
    orders, low_rank = variant_settings(decoder["variant"])
    model = VideoCaptioner(
        input_dims, len(vocabulary), orders=orders, low_rank=low_rank, max_lengths=max_lengths,
        feature_dim=decoder["feature_dim"], embed_dim=decoder["embed_dim"], hidden_dim=decoder["hidden_dim"],
        attention_dim=decoder["attention_dim"], rank=decoder["rank"], combination=decoder["combination"],
        dropout=decoder["dropout"], encoder=decoder["encoder"],
    )
    return CaptioningTask(
        model, vocabulary, lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
        label_smoothing=config["task"]["label_smoothing"], beam_size=section["beam_size"],
        max_length=section["max_length"], length_penalty=section["length_penalty"], meteor=section["meteor"],
        allow_unknown=section["allow_unknown"],
    )


def _extras(config: Mapping[str, Any], data: CaptioningData) -> dict[str, Any]:
    # The keys every polyfuse checkpoint has (engine/checkpoints.py EXTRAS_KEYS).
    return {
        "config": dict(config), "modalities": data.modalities, "input_dims": data.input_dims,
        "label_info": {"vocabulary": data.vocabulary.words, "max_lengths": data.max_lengths}, "stats": {},
    }


def _check_resume(path: Path, task: CaptioningTask, config: Mapping[str, Any]) -> None:
    checkpoint = read_checkpoint(path)
    extras = checkpoint.get("polyfuse") or {}
    saved = resolve_config(defaults_then(extras.get("config") or {}))
    if saved.get("decoder") != config["decoder"]:
        raise ValueError(f"cannot resume from {path}: it was trained with another decoder configuration")
    state = checkpoint.get("state_dict") or {}
    expected = task.state_dict()
    if set(state) != set(expected) or any(tuple(state[k].shape) != tuple(v.shape) for k, v in expected.items()):
        raise ValueError(f"cannot resume from {path}: its weights belong to another model")
    check_finite_state(state, path)


def _metrics(results: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    values = results[0] if results else {}
    return {key[len(prefix) + 1 :]: float(value) for key, value in values.items() if key.startswith(prefix + "/")}


def train_captioning(
    config: dict[str, Any], run_dir: Path, resume_checkpoint: Path | None, callbacks: Sequence[Callback]
) -> Any:
    """A captioning training run (called by :func:`polyfuse.engine.run.train`); a RunResult."""
    from polyfuse.engine.run import RunResult

    seed_everything(int(config["seed"]))
    if config["trainer"]["devices"] != 1:
        raise ValueError("captioning trains on one process: set trainer.devices to 1")
    data = build_captioning_data(config)
    datamodule = CaptioningDataModule(
        data, batch_size=config["data"]["batch_size"], eval_batch_size=config["data"]["eval_batch_size"],
        seed=int(config["seed"]),
    )
    task = build_captioning_task(config, data.input_dims, data.max_lengths, data.vocabulary)
    task.checkpoint_extras = _extras(config, data)
    task.references = data.captions
    word_vectors = None
    if resume_checkpoint is not None:
        _check_resume(resume_checkpoint, task, config)
    elif config["decoder"]["word_vectors"]:
        word_vectors = initialise_word_embeddings(task, config["decoder"], int(config["seed"]))
    steps = -(-len(datamodule._pairs["train"]) // config["data"]["batch_size"])
    trainer, checkpoint = build_trainer(config, run_dir, callbacks=callbacks, steps_per_epoch=steps)
    atomic_write_text(run_dir / "config.yaml", dump_config(config))
    start = time.perf_counter()
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=str(resume_checkpoint) if resume_checkpoint else None)
    except SystemExit:
        if trainer.interrupted:
            raise RunInterrupted(run_dir) from None
        raise
    seconds = time.perf_counter() - start
    best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else None
    if best is None or not best.is_file():
        raise RuntimeError(f"training produced no best checkpoint in {run_dir / 'checkpoints'}")
    validation = _metrics(trainer.validate(task, datamodule=datamodule, ckpt_path=str(best), verbose=False), "val")
    test = _metrics(trainer.test(task, datamodule=datamodule, ckpt_path=str(best), verbose=False), "test")
    epochs = int(trainer.current_epoch)
    monitor, mode = monitor_of(config)
    summary = {
        "best_checkpoint": os.path.relpath(best, run_dir), "monitor": monitor, "mode": mode,
        "validation": validation, "test": test, "epochs": epochs, "best_epoch": checkpoint_epoch(best),
        "train_seconds": round(seconds, 3),
        "resumed": resume_checkpoint is not None,
        "samples": {split: len(videos) for split, videos in data.splits.items()},
        "skipped_videos": data.skipped, "vocabulary": len(data.vocabulary),
        "test_reference_oov": reference_oov(data, "test"), "word_vectors": word_vectors,
        "metric_details": {k: v for k, v in task.test_details.items() if not isinstance(v, float)},
    }
    atomic_write_text(run_dir / "results.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(run_dir / "test_captions.json", json.dumps(
        {v: {"generated": task.generated[v], "references": data.captions[v]} for v in data.splits["test"]},
        indent=2) + "\n")
    try:
        from polyfuse.engine.plots import plot_learning_curves

        plot_learning_curves(run_dir, run_dir / "learning_curves.png")
    except (ValueError, ImportError):  # pragma: no cover
        pass
    return RunResult(run_dir, best, validation, test, epochs, seconds, config, checkpoint_epoch(best))


def initialise_word_embeddings(task: CaptioningTask, decoder: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Set the decoder's word embeddings to pre-trained vectors (HOCA section 5.2: words
    without one are drawn at random; :mod:`polyfuse.data.formats.word_vectors`)."""
    from polyfuse.data.formats.word_vectors import caption_word_vectors, initial_word_embedding

    words = task.vocabulary.words
    vectors, found = caption_word_vectors(
        words, decoder["word_vectors"], file=decoder["word_vectors_file"], dim=decoder["embed_dim"]
    )
    table, count = initial_word_embedding(vectors, found, generator=torch.Generator().manual_seed(seed))
    embedding = task.model.decoder.embedding.weight
    with torch.no_grad():
        embedding.copy_(table.to(embedding.dtype))
    return {"source": decoder["word_vectors"], "found": count, "words": len(words) - 4}


def reference_oov(data: CaptioningData, split: str) -> dict[str, Any]:
    """Word tokens of ``split``'s reference captions outside the vocabulary (PTB tokens)."""
    from polyfuse.data.formats.captioning import ptb_tokenize

    tokens = [w for v in data.splits.get(split, []) for c in data.captions[v] for w in ptb_tokenize(c)]
    unknown = sum(w not in data.vocabulary.index for w in tokens)
    return {"tokens": len(tokens), "unknown": unknown, "rate": round(unknown / len(tokens), 4) if tokens else None}


def is_captioning_checkpoint(checkpoint: str | Path) -> bool:
    _, extras = load_state(checkpoint)
    return (extras.get("config") or {}).get("task", {}).get("type") == "captioning"


def load_captioning_model(checkpoint: str | Path) -> tuple[CaptioningTask, dict[str, Any]]:
    """The task of a captioning checkpoint, weights loaded, in eval mode, and its extras."""
    from polyfuse.data.formats.captioning import Vocabulary

    state, extras = load_state(checkpoint)
    # An older checkpoint is built as its version built it (e.g. decoder.encoder: linear before 0.3.0).
    warn_default_changes(extras["config"], origin=str(checkpoint))
    config = resolve_config(defaults_then(extras["config"]))
    info = extras["label_info"]
    task = build_captioning_task(config, extras["input_dims"], info["max_lengths"], Vocabulary(info["vocabulary"]))
    try:
        task.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{checkpoint}: the weights do not fit the stored configuration: {error}") from None
    task.eval()
    return task, {**extras, "config": config}


def checkpoint_captioning_data(extras: Mapping[str, Any]) -> CaptioningData:
    """The captioning data a checkpoint applies to (its configuration's feature files, its
    vocabulary), refused when the features do not fit the checkpoint."""
    data = build_captioning_data(extras["config"], vocabulary=extras["label_info"]["vocabulary"])
    if data.input_dims != list(extras["input_dims"]):
        raise ValueError(
            f"the feature files give sizes {data.input_dims}; the checkpoint was trained on {list(extras['input_dims'])}"
        )
    if any(n > m for n, m in zip(data.max_lengths, extras["label_info"]["max_lengths"], strict=True)):
        raise ValueError(f"the features are longer ({data.max_lengths}) than in training ({extras['label_info']['max_lengths']})")
    return data


def _videos(data: CaptioningData, split: str) -> list[str]:
    if split == "all":
        return list(data.videos)
    key = {"val": "valid", "validation": "valid"}.get(split, split)
    if key not in data.splits:
        raise ValueError(f"no {split!r} split; have train, valid, test, all")
    return data.splits[key]


def _quiet_trainer(config: Mapping[str, Any]):
    config = {**config, "trainer": {**config["trainer"], "devices": 1, "strategy": "auto", "progress_bar": False}}
    trainer, _ = build_trainer(config, None, for_training=False)
    return trainer


def evaluate_captioning(checkpoint: str | Path, *, split: str = "test") -> dict[str, float]:
    """Caption metrics and loss of a checkpoint on one split (beam search as configured)."""
    task, extras = load_captioning_model(checkpoint)
    data = checkpoint_captioning_data(extras)
    task.references = data.captions
    module = CaptioningDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    results = _quiet_trainer(extras["config"]).test(task, dataloaders=module.video_loader(_videos(data, split)), verbose=False)
    return _metrics(results, "test")


def predict_captioning(checkpoint: str | Path, *, split: str = "all", out: str | Path | None = None) -> dict[str, str]:
    """The generated caption of every video of ``split``; written as JSON {video: caption} to ``out``."""
    task, extras = load_captioning_model(checkpoint)
    data = checkpoint_captioning_data(extras)
    module = CaptioningDataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    with torch.no_grad():
        outputs = _quiet_trainer(extras["config"]).predict(task, dataloaders=module.video_loader(_videos(data, split)))
    captions = {video: caption for batch in outputs for video, caption in batch.items()}
    if out is not None:
        atomic_write_text(Path(out), json.dumps(captions, indent=2) + "\n")
    return captions
