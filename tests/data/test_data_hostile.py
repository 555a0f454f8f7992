"""Hostile feature files for retrieval experts, captioning features and VQA image
features (issue 29): decompression bombs refused from the header with memory bounded,
HDF5 external storage and links refused, NaN / Inf image features refused; each a
ValueError naming the file and the array."""

import io
import re
import tracemalloc
import zipfile

import h5py
import numpy as np
import pytest

from polyfuse.data.formats.captioning import load_video_features
from polyfuse.data.formats.experts import load_expert
from polyfuse.data.formats.features import load_image_features

BOMB_SHAPE = (70_000, 1024)  # float32: 287 MB in memory, 1.3 MB on disk (230 times)


@pytest.fixture(scope="module")
def npz_bomb(tmp_path_factory):
    """A genuine compressed npz of zeros: ``features`` inflates 230 times (as the issue's 27 MB -> 6.3 GB),
    written in 16 MB pieces (memory bounded), with ``video_ids`` one per row."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    ids = io.BytesIO()
    np.save(ids, np.array([f"v{i}" for i in range(BOMB_SHAPE[0])]))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("features.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(
                member, {"descr": "<f4", "fortran_order": False, "shape": BOMB_SHAPE})
            zeros, left = bytes(16 << 20), BOMB_SHAPE[0] * BOMB_SHAPE[1] * 4
            while left > 0:
                member.write(zeros[: min(left, len(zeros))])
                left -= len(zeros)
        archive.writestr("video_ids.npy", ids.getvalue())
    assert path.stat().st_size < 4 << 20
    return path


@pytest.mark.parametrize("load", [lambda p: load_expert(p, "app"), lambda p: load_video_features(p)],
                         ids=["retrieval expert", "captioning features"])
def test_an_npz_bomb_is_refused_from_its_header_in_bounded_memory(npz_bomb, load):
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=rf"{npz_bomb}: array 'features' would inflate from \d+ stored bytes "
                           r"to 286720000 bytes .* over 100 times \(a decompression bomb\?\)"):
            load(npz_bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20  # nothing inflated: the refusal reads the header only


def _external_h5(tmp_path, layout):
    """An HDF5 file of ``layout`` whose feature dataset's bytes live in another file."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(64, dtype=np.float32).tobytes())
    path = tmp_path / f"{layout}.h5"
    with h5py.File(path, "w") as handle:
        if layout == "expert":
            handle.create_dataset("features/v0", shape=(4, 4), dtype="<f4", external=[(str(secret), 0, 64)])
        elif layout == "captioning":
            handle.create_dataset("v0", shape=(4, 4), dtype="<f4", external=[(str(secret), 0, 64)])
        else:  # VQA image features of `polyfuse extract images`
            handle.create_dataset("features", shape=(1, 4, 4), dtype="<f4", external=[(str(secret), 0, 64)])
            handle.create_dataset("boxes", data=np.zeros((1, 4, 4), np.float32))
            handle.create_dataset("image_ids", data=np.zeros(1, np.int64))
    return path


@pytest.mark.parametrize(("layout", "load"), [
    ("expert", lambda p: load_expert(p, "app")),
    ("captioning", load_video_features),
    ("vqa", load_image_features),
])
def test_h5_external_storage_and_links_are_refused(tmp_path, layout, load):
    path = _external_h5(tmp_path, layout)
    with pytest.raises(ValueError, match=rf"{path}: dataset '.*' keeps its data in external file\(s\) .*secret\.bin"):
        load(path)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle.create_dataset("x", data=np.zeros((4, 4), np.float32))
    linked = tmp_path / f"linked_{layout}.h5"
    with h5py.File(linked, "w") as handle:
        name = {"expert": "features/v0", "captioning": "v0", "vqa": "features"}[layout]
        handle[name] = h5py.ExternalLink(str(other), "x")
    with pytest.raises(ValueError, match=rf"{linked}: '{name}' is an external link to .*other\.h5"):
        load(linked)


def test_a_broken_h5_names_the_file(tmp_path):
    path = tmp_path / "broken.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)
    for load in (lambda p: load_expert(p, "app"), load_video_features, load_image_features):
        with pytest.raises(ValueError, match=rf"{path}: cannot read as HDF5"):
            load(path)


@pytest.mark.parametrize(("content", "expected"), [
    ({"sentences": [{"caption": "a man runs", "sen_id": 0}]}, "sentences: entry 0 has no field 'video_id'"),
    ({"sentences": [{"video_id": "v0", "caption": "a man"}, 7]}, "sentences: entry 1 is a int (7), expected an object"),
    ([{"id": "v0", "caption": "a dog"}, "v1"], "entry 1 is a str ('v1'), expected an object"),
    ([{"id": "v0", "caption": 3}], "entry 0, field 'caption' is 3, expected str or list"),
    (b'{"v0": ["caf\xe9 noir"]}', "not UTF-8 text (byte 0xe9 at offset 12)"),
    ('{"v0": ["a dog runs"], "v1": ["a ca', "not valid JSON (truncated?)"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
], ids=["msr-vtt sentence without video_id", "msr-vtt sentence a number", "list entry a string",
        "caption a number", "not utf-8", "truncated", "nested 100,000 deep"])
def test_malformed_caption_files_name_the_file_and_entry(tmp_path, content, expected):
    import json

    from polyfuse.data.formats.captioning import load_captions as captioning_captions
    from polyfuse.data.formats.experts import load_captions as retrieval_captions

    path = tmp_path / "captions.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError) as caught:
        captioning_captions(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message
    if isinstance(content, (bytes, str)):  # the file-level faults: retrieval's captions too
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: .*{re.escape(expected[:20])}"):
            retrieval_captions(path)
