"""Fuzz (hypothesis, derandomized) of the JSON importers: VQA questions and annotations,
caption files (captioning and retrieval), split files. Any structure, any bytes: a
successful load or one ValueError line that starts with the file's name, never another
exception type (TypeError, KeyError, AttributeError, RecursionError, UnicodeDecodeError)."""

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyfuse.data.formats.captioning import load_captions as captioning_captions
from polyfuse.data.formats.captioning import load_splits
from polyfuse.data.formats.experts import load_captions as retrieval_captions
from polyfuse.data.formats.vqa import load_vqa

# the keys the importers look for, so that random documents reach their inner checks
KEYS = ["questions", "annotations", "question_id", "image_id", "question", "answers", "answer", "answer_type",
        "sentences", "video_id", "caption", "id", "train", "val", "val", "test", "v0"]
LEAVES = (st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True, allow_infinity=True)
          | st.sampled_from(["", "a dog", "v0", "what?", "yes"]) | st.text(max_size=4))
VALUES = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=5),
    max_leaves=24,
)


def _as_bytes(value) -> bytes:
    return json.dumps(value).encode()


DOCUMENTS = (
    VALUES.map(_as_bytes)
    | st.builds(lambda v, cut: _as_bytes(v)[:cut], VALUES, st.integers(0, 40))  # truncated
    | st.binary(max_size=40)  # not JSON, often not UTF-8
    | st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth)  # deep nesting
)

FUZZ = settings(max_examples=80, deadline=1000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _loaded_or_named(load, *paths: Path) -> None:
    try:
        load()
    except ValueError as error:
        message = str(error)
        assert any(message.startswith(str(p)) for p in paths), message
        assert "\n" not in message, message


@FUZZ
@given(questions=DOCUMENTS, annotations=DOCUMENTS, per_question=st.sampled_from([None, 10]))
def test_vqa_files_load_or_name_the_file(questions, annotations, per_question):
    with tempfile.TemporaryDirectory() as folder:
        q, a = Path(folder) / "questions.json", Path(folder) / "annotations.json"
        q.write_bytes(questions)
        a.write_bytes(annotations)
        _loaded_or_named(lambda: load_vqa(q, a, answers_per_question=per_question), q, a)


@FUZZ
@given(document=DOCUMENTS)
def test_caption_and_split_files_load_or_name_the_file(document):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "captions.json"
        path.write_bytes(document)
        for load in (captioning_captions, retrieval_captions, load_splits):
            _loaded_or_named(lambda load=load: load(path), path)
