"""``task.type: vqa`` in the engine: what :mod:`polyfuse.engine.run` builds for a VQA run,
and how a VQA checkpoint is loaded, evaluated and applied.

A training run is the engine's (run directory, safetensors checkpoints, resume, early
stopping on ``val/acc``, results.json); only the data module and the task differ. A
checkpoint stores, beside the weights and the configuration, the word and answer
vocabularies, the type names of the breakdown, the PCA of the image features and how
those features were made (extractor, image size), so that evaluation and prediction,
on new images too (:mod:`polyfuse.engine.vqa_answer`), encode questions and images as
in training.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from polyfuse.data.vqa_data import VQAData, VQADataModule, build_vqa_data
from polyfuse.engine.build import build_trainer, fusion_options
from polyfuse.engine.rundir import atomic_temp_path
from polyfuse.extract.images import feature_settings
from polyfuse.tasks.vqa import VQATask, build_vqa_model

__all__ = [
    "PREDICTION_FIELDS",
    "build_vqa_task",
    "evaluate_vqa",
    "load_vqa_model",
    "predict_vqa",
    "prediction_fields",
    "vqa_data_for",
    "vqa_run_parts",
]


def _vocabulary(data: VQAData) -> dict[str, Any]:
    stored: dict[str, Any] = {"words": data.words, "answers": data.answers, "type_names": data.type_names}
    if data.pca is not None:
        stored["pca_mean"], stored["pca_directions"] = data.pca
    return stored


def build_vqa_task(config: Mapping[str, Any], vocabulary: Mapping[str, Any], image_dim: int, word_vectors=None) -> VQATask:
    """The task of a resolved VQA configuration around a new model."""
    options = fusion_options(config) if config["model"]["fusion"] != "ban" else {}
    model = build_vqa_model(
        config["model"], len(vocabulary["words"]), len(vocabulary["answers"]), image_dim,
        fusion_options=options, word_vectors=word_vectors,
    )  # fmt: skip
    return VQATask(
        model, type_names=vocabulary["type_names"], lr=config["optim"]["lr"],
        weight_decay=config["optim"]["weight_decay"], scheduler=config["optim"]["scheduler"],
        max_epochs=config["trainer"]["max_epochs"], optimizer=config["optim"]["optimizer"],
    )  # fmt: skip


def vqa_run_parts(config: Mapping[str, Any]) -> tuple[VQADataModule, VQATask, dict[str, int], int]:
    """Data module, task (checkpoint extras set), partition sizes and training steps per
    epoch of a VQA training run."""
    data = build_vqa_data(config)
    for note in data.notes:
        print(note)
    if not len(data.partitions["valid"]):
        raise ValueError("the validation partition is empty")
    vocabulary = _vocabulary(data)
    task = build_vqa_task(config, vocabulary, data.image_dim, data.word_vectors)
    task.checkpoint_extras = {
        "config": dict(config),
        "modalities": ["image", "question"],
        "input_dims": [data.image_dim, len(data.words)],
        "label_info": vocabulary,
        "stats": {},
        # how the training image features were made: new images are extracted alike
        "image_features": feature_settings(config["data"]["vqa"]["train_features"]),
    }
    datamodule = VQADataModule(
        data, batch_size=config["data"]["batch_size"], eval_batch_size=config["data"]["eval_batch_size"],
        seed=int(config["seed"]),
    )  # fmt: skip
    samples = {key: len(split) for key, split in data.partitions.items()}
    return datamodule, task, samples, -(-samples["train"] // config["data"]["batch_size"])


def load_vqa_model(state_dict: Mapping[str, torch.Tensor], extras: Mapping[str, Any], checkpoint: Any) -> VQATask:
    """The VQA task of a checkpoint's weights and extras, in eval mode."""
    task = build_vqa_task(extras["config"], extras["label_info"], int(extras["input_dims"][0]))
    try:
        task.load_state_dict(state_dict)
    except RuntimeError as error:
        raise ValueError(f"{checkpoint}: the weights do not fit the stored configuration: {error}") from None
    return task.eval()


def vqa_data_for(extras: Mapping[str, Any], partitions: Sequence[str]) -> VQAData:
    """The partitions a checkpoint is applied to, encoded with its own vocabularies and PCA."""
    return build_vqa_data(extras["config"], vocabulary=extras["label_info"], partitions=partitions)


def _partitions(split: str, source: Any, modalities: Any) -> list[str]:
    if source is not None or modalities is not None:
        raise ValueError(
            "--data and --modalities do not apply here to a VQA checkpoint: it reads its data.vqa section "
            "(polyfuse predict answers new questions with --data QUESTIONS.json --images DIR)"
        )
    if split == "all":
        return ["train", "valid", "test"]
    if split not in ("train", "valid", "test"):
        raise ValueError(f"a VQA checkpoint is applied to the split train, valid, test or all, not {split!r}")
    return [split]


def _trainer(config: Mapping[str, Any]):
    config = {**config, "trainer": {**config["trainer"], "devices": 1, "strategy": "auto", "progress_bar": False}}
    return build_trainer(config, None, for_training=False)[0]


def evaluate_vqa(
    task: VQATask, extras: Mapping[str, Any], *, split: str = "test", source: Any = None, modalities: Any = None
) -> dict[str, float]:
    """``loss``, ``acc`` and ``acc/<type>`` of a loaded VQA checkpoint on one split."""
    if split == "all":
        raise ValueError("evaluate a VQA checkpoint on one split: train, valid or test")
    (key,) = _partitions(split, source, modalities)
    data = vqa_data_for(extras, [key])
    module = VQADataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    task.stage_metrics["test"].reset()
    results = _trainer(extras["config"]).test(task, dataloaders=module.loader(key), verbose=False)
    values = results[0] if results else {}
    return {name[len("test/") :]: float(value) for name, value in values.items() if name.startswith("test/")}


PREDICTION_FIELDS = ("split", "question_id", "image_id", "question", "answer", "score", "accuracy", "type")


def prediction_fields(top_k: int = 1) -> list[str]:
    """The CSV columns of :func:`predict_vqa`: the :data:`PREDICTION_FIELDS`, then
    ``answer_<r>, score_<r>`` for the ranks r = 2 .. ``top_k``."""
    return [*PREDICTION_FIELDS, *(f"{name}_{rank}" for rank in range(2, top_k + 1) for name in ("answer", "score"))]


def predict_vqa(
    task: VQATask, extras: Mapping[str, Any], *, split: str = "test", out: str | Path | None = None,
    source: Any = None, modalities: Any = None, images: str | Path | None = None, top_k: int = 1,
) -> list[dict[str, Any]]:
    """One record per question of ``split`` (``all``: train, valid and test): the
    :data:`PREDICTION_FIELDS`, i.e. the predicted ``answer`` and its sigmoid ``score``,
    its official VQA ``accuracy`` against the human answers and the question's ``type``;
    optionally written as CSV to ``out``.

    ``top_k`` > 1 adds the next answers by logit with their sigmoid scores,
    ``answer_2, score_2, ...`` (:func:`prediction_fields`); ``answer`` stays the best one.

    New questions: ``source`` a VQA questions file about the images of ``images`` (a
    folder, extracted as the run's features were, or a features file;
    :mod:`polyfuse.engine.vqa_answer`); their records have ``split`` ``new`` and no
    ``accuracy`` or ``type``."""
    answer_count = len(extras["label_info"]["answers"])
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= answer_count:
        raise ValueError(f"--top-k must be an integer in [1, {answer_count}] (the checkpoint's answers), got {top_k!r}")
    if source is not None or images is not None:
        from polyfuse.engine.vqa_answer import NEW_SPLIT, new_questions_data

        if source is None or images is None or modalities is not None or split not in ("all", NEW_SPLIT):
            raise ValueError(
                "new questions for a VQA checkpoint take --data QUESTIONS.json and --images DIR (or a features "
                "file), without --split or --modalities"
            )
        keys, data = [NEW_SPLIT], new_questions_data(extras, source, images)
    else:
        keys = _partitions(split, source, modalities)
        data = vqa_data_for(extras, keys)
    module = VQADataModule(data, batch_size=1, eval_batch_size=extras["config"]["data"]["eval_batch_size"])
    trainer = _trainer(extras["config"])
    task.predict_top_k = top_k
    records = []
    for key in keys:
        part = data.partitions[key]
        for output in trainer.predict(task, dataloaders=module.loader(key)) or []:
            for row, answers, scores in zip(output["row"].tolist(), output["answers"].tolist(), output["scores"].tolist(), strict=True):
                question, type_index, answer = part.questions[row], int(part.types[row]), answers[0]
                record = {
                    "split": key,
                    "question_id": question.question_id,
                    "image_id": question.image_id,
                    "question": question.question,
                    "answer": data.answers[answer],
                    "score": round(float(scores[0]), 6),
                    "accuracy": float(part.answer_scores[row][part.answer_ids[row] == answer].sum())
                    if question.answers else "",  # new questions have no human answers
                    "type": data.type_names[type_index] if type_index >= 0 else "",
                }  # fmt: skip
                for rank in range(2, top_k + 1):
                    record[f"answer_{rank}"] = data.answers[answers[rank - 1]]
                    record[f"score_{rank}"] = round(float(scores[rank - 1]), 6)
                records.append(record)
    if out is not None:
        with atomic_temp_path(Path(out)) as temp, temp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=prediction_fields(top_k))
            writer.writeheader()
            writer.writerows(records)
    return records


def plot_vqa_checkpoint_attention(
    task: VQATask,
    extras: Mapping[str, Any],
    out: str | Path,
    *,
    question_ids: Sequence[int] | None = None,
    sample: int = 0,
    split: str = "test",
    images: str | Path | None = None,
) -> list[Path]:
    """PNG figures of BAN's attention (:func:`polyfuse.figures.vqa.draw_vqa_attention`)
    for questions of ``split``: those of ``question_ids``, or the ``sample``-th. One
    question is written to ``out``; several to ``<out stem>_<question id>.png``. The
    image under the maps comes from ``images`` (a folder of ``<image id>.png|jpg``),
    or for easy-VQA from the installed package."""
    import math

    import numpy as np

    from polyfuse.data.formats.vqa import tokenize
    from polyfuse.figures.vqa import draw_vqa_attention

    config = extras["config"]
    if config["model"]["fusion"] != "ban":
        raise ValueError(f"a {config['model']['fusion']} model has no bilinear attention maps; plot a BAN checkpoint")
    if split == "all":
        raise ValueError("plot attention takes questions of one split: train, valid or test")
    (key,) = _partitions(split, None, None)
    part = vqa_data_for(extras, [key]).partitions[key]
    position = {q.question_id: i for i, q in enumerate(part.questions)}
    if question_ids:
        unknown = [q for q in question_ids if q not in position]
        if unknown:
            raise ValueError(f"question id(s) {unknown} are not in the {key} split")
        rows = [position[q] for q in question_ids]
    else:
        if not 0 <= sample < len(part):
            raise ValueError(f"--sample {sample} is outside the {key} split's {len(part)} questions")
        rows = [sample]
    if images is None and config["data"]["vqa"]["easy_vqa"]:
        from polyfuse.data.formats.easy_vqa import easy_vqa_image_folder

        images = easy_vqa_image_folder("train" if key in ("train", "valid") else "test")
    out = Path(out)
    written = []
    for row in rows:
        question = part.questions[row]
        batch = part.batch(torch.tensor([row]))
        with torch.no_grad():
            logits, attention = task(batch)
        length = batch["tokens"].shape[1]
        words = tokenize(question.question)[:length]
        words += ["-"] * (length - len(words))
        objects = batch["image"].shape[1]
        side = math.isqrt(objects)
        grid = (side, side) if side * side == objects else (1, objects)  # regions: one row
        picture = None
        if images is not None:
            from PIL import Image

            found = [p for p in (Path(images) / f"{question.image_id}.{e}" for e in ("png", "jpg", "jpeg")) if p.is_file()]
            if not found:
                raise FileNotFoundError(f"no image {question.image_id}.png|jpg in {images}")
            picture = np.asarray(Image.open(found[0]).convert("RGB"))
        answer = extras["label_info"]["answers"][int(logits.argmax())]
        title = f"{question.question}  predicted: {answer}  (answers: {', '.join(dict.fromkeys(question.answers))})"
        path = out if len(rows) == 1 else out.with_name(f"{out.stem}_{question.question_id}{out.suffix or '.png'}")
        written.append(draw_vqa_attention(attention[0], words, grid, picture, path, title=title))
    return written
