"""A trained VQA checkpoint applied to new questions about new images:
``polyfuse predict --checkpoint CKPT --data QUESTIONS.json --images DIR --out answers.csv``.

The questions file is a VQA 2.0 questions file, without annotations::

    {"questions": [{"question_id": 1, "image_id": 42, "question": "what color is the shape?"}, ...]}

The images are a folder of ``<image id>.png|jpg`` (``polyfuse extract images``'s
rules: a file not named by an integer id is skipped with a warning) or an HDF5 file
that ``polyfuse extract images`` wrote. A folder is extracted as the run's own
features were: the run records the extractor and image size of its training
features (``image_features`` in the checkpoint's extras), and the CNN weights come
from the installed package, so nothing is downloaded. The questions are encoded with
the checkpoint's word vocabulary and the features projected with its PCA, as in
training; the words it lacks, which the model reads as ``<unk>``, are named in one
warning (:func:`unknown_words`).
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from polyfuse.data.formats.features import ImageFeatures, is_bottom_up, load_image_features
from polyfuse.data.formats.jsonfile import entry_field, json_list, read_json
from polyfuse.data.formats.vqa import UNKNOWN_WORD, VQAQuestion
from polyfuse.tasks.vqa.data import VQAData, encode_split, project_features
from polyfuse.text import tokenize_question

__all__ = ["NEW_SPLIT", "load_new_questions", "new_questions_data", "recorded_feature_settings", "unknown_words",
           "warn_unknown_words"]

#: the ``split`` column of the predictions for questions given with ``--data``
NEW_SPLIT = "new"
#: the unknown words a warning names (the most frequent first); the rest are counted
WORDS_NAMED = 20


def load_new_questions(path: str | Path) -> list[VQAQuestion]:
    """The questions of a VQA 2.0 questions file (no annotations: no human answers),
    in file order. A missing or mistyped field, or a question id given twice, is a
    ValueError naming the file and the entry."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"questions file {path} does not exist")
    questions, seen = [], {}
    for index, entry in enumerate(json_list(read_json(path), path, "questions")):
        question_id = entry_field(entry, "question_id", path, index, int)
        if question_id in seen:
            raise ValueError(f"{path}: entry {index} repeats question_id {question_id} of entry {seen[question_id]}")
        seen[question_id] = index
        image_id = entry_field(entry, "image_id", path, index, int)
        questions.append(VQAQuestion(question_id, image_id, entry_field(entry, "question", path, index, str), (), "", ""))
    if not questions:
        raise ValueError(f"{path}: the questions list is empty")
    return questions


def unknown_words(questions: Sequence[VQAQuestion], words: Sequence[str], max_length: int) -> Counter[str]:
    """How often each word outside ``words`` occurs among the words the model reads of
    ``questions`` (the first ``max_length`` of each, as
    :func:`~polyfuse.data.formats.vqa.encode_questions` reads them)."""
    known = set(words) - {UNKNOWN_WORD}
    return Counter(w for q in questions for w in tokenize_question(q.question)[:max_length] if w not in known)


def warn_unknown_words(counts: Counter[str], words: Sequence[str], *, named: int = WORDS_NAMED) -> None:
    """One warning naming the words of ``counts`` (the most frequent first, ``word xN``
    when asked N > 1 times; past ``named`` words, how many more), if there are any."""
    if not counts:
        return
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    listed = ", ".join(word if count == 1 else f"{word} x{count}" for word, count in ranked[:named])
    more = f" and {len(ranked) - named} more" if len(ranked) > named else ""
    read_as = UNKNOWN_WORD if UNKNOWN_WORD in words else "padding (the checkpoint predates <unk>)"
    warnings.warn(
        f"VQA: {len(counts)} word(s) of the questions are not in the checkpoint's vocabulary and read as "
        f"{read_as}: {listed}{more}",
        RuntimeWarning, stacklevel=3,
    )


def recorded_feature_settings(extras: Mapping[str, Any]) -> dict[str, Any]:
    """How the checkpoint's training image features were made
    (:func:`polyfuse.extract.images.feature_settings`): stored in the checkpoint, or for a
    checkpoint written before that, read from its training features file if it is still
    there."""
    if "image_features" in extras:
        return dict(extras["image_features"])
    from polyfuse.extract.images import feature_settings

    path = Path(extras["config"]["data"]["vqa"]["train_features"])
    if not path.is_file():
        raise ValueError(
            f"this checkpoint does not record how its image features were made (it predates that record) and "
            f"its training features {path} are gone: extract the new images with the settings of the training "
            "features (polyfuse extract images DIR --out new.h5 --image-size S) and give --images new.h5"
        )
    return feature_settings(path)


def _describe(settings: Mapping[str, Any]) -> str:
    made = (f"{settings['extractor']} at {settings['image_size']} px, "
            if settings.get("extractor") and settings.get("image_size") else "")  # fmt: skip
    objects = settings["objects"] if settings.get("objects") is not None else "a varying number of"
    return f"{made}{objects} objects of {settings['feature_size']} values per image"


def _check_file(path: Path, trained: Mapping[str, Any]) -> None:
    from polyfuse.extract.images import feature_settings

    given = feature_settings(path)
    same_shape = (given["objects"], given["feature_size"]) == (trained["objects"], trained["feature_size"])
    same_maker = not (given["extractor"] and trained.get("extractor")) or (
        (given["extractor"], given["image_size"]) == (trained["extractor"], trained["image_size"])
    )
    if not (same_shape and same_maker):
        hint = (f": extract the images with --image-size {trained['image_size']}"
                if trained.get("extractor") and trained.get("image_size") else "")  # fmt: skip
        raise ValueError(f"{path} holds features of {_describe(given)}; the checkpoint was trained on "
                         f"{_describe(trained)}{hint}")


def _extract(folder: Path, trained: Mapping[str, Any], work: Path) -> tuple[Path, dict[int, Path]]:
    """The features of the images of ``folder`` as the run's were made, in a file under
    ``work``, and the images that could not be read (``{image id: path}``)."""
    from polyfuse.extract.images import EXTRACTOR, extract_image_features, image_ids_of_folder

    if trained.get("extractor") != EXTRACTOR or not trained.get("image_size"):
        raise ValueError(
            f"the checkpoint was trained on image features ({_describe(trained)}) that polyfuse extract images "
            "did not write, so new images cannot be extracted alike: make their features the same way and give "
            "--images the HDF5 file"
        )
    images = image_ids_of_folder(folder)
    out = work / "features.h5"
    report = extract_image_features(images, out, image_size=int(trained["image_size"]), progress=sys.stderr.isatty())
    skipped = {str(path) for path in report.skipped}
    return out, {image_id: path for image_id, path in images.items() if str(path) in skipped}


def new_questions_data(extras: Mapping[str, Any], questions_path: str | Path, images: str | Path) -> VQAData:
    """The questions of ``questions_path`` about the images of ``images`` (a folder or an
    HDF5 features file), as the one split :data:`NEW_SPLIT` of a :class:`VQAData`
    encoded with the checkpoint's vocabularies and PCA. Questions about an image that
    could not be decoded are left out with one warning; an image id with no image is
    an error listing the ids."""
    images = Path(images)
    questions = load_new_questions(questions_path)
    trained = recorded_feature_settings(extras)
    vocabulary = extras["label_info"]
    with tempfile.TemporaryDirectory(prefix="polyfuse-predict-") as work:
        if images.is_dir():
            path, unreadable = _extract(images, trained, Path(work))
        elif images.is_file():
            if is_bottom_up(images):
                raise ValueError(
                    f"--images {images} is a bottom-up features file of ban-vqa (dataset image_features); predict "
                    "reads the layout of polyfuse extract images (features, boxes, image_ids): write the rows of "
                    "its images in that layout (docs/VQA.md, Image features)"
                )
            path, unreadable = images, {}
            _check_file(images, trained)
        else:
            raise FileNotFoundError(f"--images {images} is neither a folder of images nor a features file")
        features: ImageFeatures = load_image_features(path)
    features.source = str(images)
    missing = sorted({q.image_id for q in questions} - set(features.rows) - set(unreadable))
    if missing:
        raise ValueError(
            f"{images}: no image for image id(s) {missing[:10]}{' ...' if len(missing) > 10 else ''} "
            f"({len(missing)} missing) asked about in {questions_path}"
        )
    left_out = [q for q in questions if q.image_id in unreadable]
    if left_out:
        warnings.warn(
            f"{len(left_out)} question(s) not answered: their image could not be read "
            f"({', '.join(str(unreadable[i]) for i in sorted({q.image_id for q in left_out})[:5])})",
            stacklevel=2,
        )
        questions = [q for q in questions if q.image_id not in unreadable]
        if not questions:
            raise ValueError(f"no question of {questions_path} is about an image that could be read")
    pca = (vocabulary["pca_mean"], vocabulary["pca_directions"]) if "pca_mean" in vocabulary else None
    if pca is not None:  # the new images are few and in memory: projected once
        features.features = project_features(features.features, *pca)
    image_dim = features.dim
    if image_dim != int(extras["input_dims"][0]):  # a features file of another size, found by _check_file
        raise ValueError(f"{images}: image features of size {image_dim}, the checkpoint expects {extras['input_dims'][0]}")
    config = extras["config"]
    data = VQAData({}, list(vocabulary["words"]), list(vocabulary["answers"]), list(vocabulary["type_names"]), image_dim, pca)
    # new questions carry no answers, so the soft-score rule never applies; a checkpoint
    # saved before data.vqa.soft_score existed was trained with min(n/3, 1)
    section = {"soft_score": "min_third", **config["data"]["vqa"]}
    warn_unknown_words(unknown_words(questions, data.words, int(section["max_length"])), data.words)
    data.splits[NEW_SPLIT] = encode_split(questions, features, data, section, f"questions of {questions_path}")
    return data
