"""easy-VQA (pip package ``easy-vqa`` 1.0, MIT licence) in the VQA 2.0 format.

4,000 training and 1,000 test images of 64x64 shapes; 38,575 / 9,673 questions with
13 answers (yes/no, shape and colour questions). Each question has a single answer,
written ten times so that the VQA accuracy is 1 for it and 0 for anything else.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["QUESTION_TYPES", "import_easy_vqa", "question_type"]

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


def import_easy_vqa(out_dir: str | Path, *, limit: int | None = None) -> dict[str, dict[str, str]]:
    """Write ``{split}_questions.json`` and ``{split}_annotations.json`` for the train and
    test splits into ``out_dir`` and return, per split, the file paths and the image
    folder of the installed package (``images``).

    Args:
        out_dir: folder to write into (created).
        limit: keep the questions of the first ``limit`` image ids of each split
            (for tests and quick runs); None keeps all.
    """
    easy_vqa = _package()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    readers = {
        "train": (easy_vqa.get_train_questions, easy_vqa.get_train_image_paths),
        "test": (easy_vqa.get_test_questions, easy_vqa.get_test_image_paths),
    }
    result = {}
    for split, (read_questions, read_images) in readers.items():
        texts, answers, image_ids = read_questions()
        image_paths = read_images()
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
        questions_path = out_dir / f"{split}_questions.json"
        annotations_path = out_dir / f"{split}_annotations.json"
        questions_path.write_text(json.dumps({"questions": questions}))
        annotations_path.write_text(json.dumps({"annotations": annotations}))
        folder = Path(next(iter(image_paths.values()))).parent
        result[split] = {
            "questions": str(questions_path),
            "annotations": str(annotations_path),
            "images": str(folder),
        }
    return result
