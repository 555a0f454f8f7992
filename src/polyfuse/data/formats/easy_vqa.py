"""easy-VQA (pip package ``easy-vqa`` 1.0, MIT licence) in the VQA 2.0 format.

4,000 training and 1,000 test images of 64x64 shapes; 38,575 / 9,673 questions with
13 answers (yes/no, shape and colour questions). Each question has a single answer,
written ten times so that the VQA accuracy is 1 for it and 0 for anything else.
"""

from __future__ import annotations

import json
from pathlib import Path

from polyfuse.data.formats.vqa import VQAQuestion

__all__ = [
    "QUESTION_TYPES",
    "easy_vqa_image_folder",
    "easy_vqa_questions",
    "easy_vqa_records",
    "import_easy_vqa",
    "question_type",
]

_SHAPES = frozenset({"circle", "rectangle", "triangle"})
QUESTION_TYPES = ("yes/no", "shape", "color")


def question_type(answer: str) -> str:
    """``yes/no``, ``shape`` or ``color``, from the answer of an easy-VQA question."""
    if answer in ("yes", "no"):
        return "yes/no"
    return "shape" if answer in _SHAPES else "color"


def _package():
    try:
        import easy_vqa
    except ImportError:
        raise ValueError(
            "easy-VQA is not installed: pip install 'polyfuse[vqa]' (or pip install easy-vqa==1.0)"
        ) from None
    return easy_vqa


def easy_vqa_records(split: str, *, limit: int | None = None) -> tuple[list[dict], list[dict], Path]:
    """The VQA 2.0 question and annotation entries of an easy-VQA split (``train`` or
    ``test``) and the package's image folder of that split.

    Question ids are the positions of the questions in the package's lists; ``limit``
    keeps the questions of the first ``limit`` image ids (None keeps all)."""
    easy_vqa = _package()
    readers = {
        "train": (easy_vqa.get_train_questions, easy_vqa.get_train_image_paths),
        "test": (easy_vqa.get_test_questions, easy_vqa.get_test_image_paths),
    }
    if split not in readers:
        raise ValueError(f"easy-VQA has the splits train and test, not {split!r}")
    read_questions, read_images = readers[split]
    texts, answers, image_ids = read_questions()
    questions, annotations = [], []
    for number, (text, answer, image_id) in enumerate(zip(texts, answers, image_ids, strict=True)):
        if limit is not None and image_id >= limit:
            continue
        kind = question_type(answer)
        questions.append({"question_id": number, "image_id": image_id, "question": text})
        annotations.append(
            {
                "question_id": number,
                "image_id": image_id,
                "answers": [{"answer": answer, "answer_id": i + 1} for i in range(10)],
                "answer_type": "yes/no" if kind == "yes/no" else "other",
                "question_type": kind,
                "multiple_choice_answer": answer,
            }
        )
    folder = Path(next(iter(read_images().values()))).parent
    return questions, annotations, folder


def easy_vqa_questions(split: str, *, limit: int | None = None) -> list[VQAQuestion]:
    """An easy-VQA split as :class:`VQAQuestion` records (what :func:`import_easy_vqa`
    writes and :func:`polyfuse.data.formats.vqa.load_vqa` reads back)."""
    questions, annotations, _ = easy_vqa_records(split, limit=limit)
    return [
        VQAQuestion(
            q["question_id"], q["image_id"], q["question"], tuple(a["answer"] for a in annotation["answers"]),
            annotation["answer_type"], annotation["question_type"], annotation["multiple_choice_answer"],
        )
        for q, annotation in zip(questions, annotations, strict=True)
    ]


def easy_vqa_image_folder(split: str) -> Path:
    """The folder of the installed package's images of ``split`` (``<image id>.png``)."""
    easy_vqa = _package()
    paths = (easy_vqa.get_train_image_paths if split == "train" else easy_vqa.get_test_image_paths)()
    return Path(next(iter(paths.values()))).parent


def import_easy_vqa(out_dir: str | Path, *, limit: int | None = None) -> dict[str, dict[str, str]]:
    """Write ``{split}_questions.json`` and ``{split}_annotations.json`` for the train and
    test splits into ``out_dir`` and return, per split, the file paths and the image
    folder of the installed package (``images``).

    Args:
        out_dir: folder to write into (created).
        limit: keep the questions of the first ``limit`` image ids of each split
            (for tests and quick runs); None keeps all.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {}
    for split in ("train", "test"):
        questions, annotations, folder = easy_vqa_records(split, limit=limit)
        questions_path = out_dir / f"{split}_questions.json"
        annotations_path = out_dir / f"{split}_annotations.json"
        questions_path.write_text(json.dumps({"questions": questions}))
        annotations_path.write_text(json.dumps({"annotations": annotations}))
        result[split] = {
            "questions": str(questions_path),
            "annotations": str(annotations_path),
            "images": str(folder),
        }
    return result
