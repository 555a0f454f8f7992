"""Fuzz the data importers a user's own data goes through (hypothesis, derandomised): the
generic ``.npz`` and ``.h5`` files and the word-aligned directory, read and prepared as a
run prepares them. Random structure (missing arrays, wrong dtypes and ranks, NaN, empty
arrays, corrupt bytes, random labels, lengths, splits and padding) ends in a successful
load or in a one-line ``ValueError`` / ``FileNotFoundError`` that names the file (exit 2
on the command line), never in another exception, and never allocates more than
:data:`MEMORY_BOUND` bytes (tracemalloc's peak, which numpy's allocations report to)
for files of a few kilobytes."""

import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyfuse.data import load_source, prepare_data

MEMORY_BOUND = 16 << 20  # bytes: the files are at most a few kB; a bug that inflates them would cross it
FUZZ = settings(
    derandomize=True, max_examples=40, deadline=3000, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

DTYPES = ["float32", "float64", "int64", "int8", "uint8", "bool", "U3", "S2", "complex64"]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, 1e30, -7.0, 0.667]


@st.composite
def arrays(draw, *, rows):
    """An array of random rank (0-4), dtype and contents, its first axis usually ``rows``."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 4))
    shape = [draw(st.sampled_from([rows, rows, 0, 1, 3]))] if rank else []
    shape += [draw(st.integers(0, 4)) for _ in range(rank - 1)]
    size = int(np.prod(shape, dtype=np.int64))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if dtype.startswith(("U", "S")):
        values = rng.choice(["train", "val", "test", "dev", "x", "", "tr"], size=size).astype(dtype)
    else:
        values = rng.normal(size=size) * draw(st.sampled_from([1.0, 3.0, 100.0]))
        if size and draw(st.booleans()) and np.dtype(dtype).kind in "fc":
            values[rng.integers(0, size, size=max(1, size // 5))] = draw(st.sampled_from(SPECIALS))
        with np.errstate(invalid="ignore", over="ignore"):
            values = values.astype(dtype)
    return values.reshape(shape)


def well_formed(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(size=(rows, 4, 3)).astype(np.float32),
        "b": rng.normal(size=(rows, 2)).astype(np.float32),
        "a_lengths": rng.integers(0, 5, size=rows),
        "label": np.clip(rng.normal(size=rows) + 2.0, 1.0, 3.0).astype(np.float32),
        "split": np.array((["train"] * 6 + ["val", "test"] * 3)[:rows]),
    }


@st.composite
def tables(draw):
    """Named arrays of the generic format (modalities a, b, a's lengths, label, split), well
    formed but for 0 to 3 of them: missing, or random in rank, dtype and contents."""
    rows = draw(st.sampled_from([12, 12, 12, 0, 1, 5]))
    content = well_formed(rows, draw(st.integers(0, 2**16)))
    for name in draw(st.lists(st.sampled_from(sorted(content)), max_size=3, unique=True)):
        if draw(st.integers(0, 3)) == 0:
            del content[name]
        else:
            content[name] = draw(arrays(rows=rows))
    return content


CONFIGS = st.fixed_dictionaries({
    "task": st.sampled_from([
        {"type": "sentiment"}, {"type": "sentiment", "target_ranges": [[-3, 3]]},
        {"type": "traits"}, {"type": "traits", "target_ranges": [[1, 7]], "out_of_range": "clip"},
        {"type": "traits", "target_names": ["reserved", "confident"]}, {"type": "classification"},
    ]),
    "padding": st.sampled_from(["auto", "auto", "left", "right"]),
    "nonfinite": st.sampled_from(["error", "zero", "mean"]),
})


def names_the_file(message: str, path: Path) -> bool:
    return str(path) in message or str(path.parent) in message


def load_and_prepare(path: Path, config: dict, *, modalities=("a", "b")):
    """What a run does with the source (engine.build.build_data), under tracemalloc."""
    tracemalloc.start()
    try:
        table = load_source(str(path))
        data = {"modalities": list(modalities) if modalities else list(table.modalities),
                "split": "split", "padding": config["padding"], "nonfinite": config["nonfinite"]}
        kind = {"sentiment": "score", "traits": "scores", "classification": "class"}[config["task"]["type"]]
        return prepare_data(table, data, config["task"], label_kind=kind)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"{path}: {peak} bytes at peak"


def check_outcome(path: Path, config: dict, **kwargs) -> None:
    try:
        load_and_prepare(path, config, **kwargs)
    except (ValueError, FileNotFoundError) as error:
        message = str(error)
        assert "\n" not in message, message
        assert names_the_file(message, path), message


@FUZZ
@given(content=tables(), config=CONFIGS, corrupt=st.sampled_from([None, None, None, "truncate", "garbage"]))
def test_npz_files_load_or_fail_in_one_line_naming_the_file(tmp_path_factory, content, config, corrupt):
    path = tmp_path_factory.mktemp("npz") / "features.npz"
    np.savez(path, **content)
    if corrupt == "truncate":
        path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    elif corrupt == "garbage":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    check_outcome(path, config)


@FUZZ
@given(content=tables(), config=CONFIGS, grouped=st.booleans(), attribute=st.booleans())
def test_h5_files_load_or_fail_in_one_line_naming_the_file(tmp_path_factory, content, config, grouped, attribute):
    path = tmp_path_factory.mktemp("h5") / "features.h5"
    with h5py.File(path, "w") as handle:
        for name, array in content.items():
            if array.dtype.kind == "U":
                array = array.astype("S")  # HDF5 stores bytes
            where = handle.require_group("g") if grouped and name == "b" else handle
            dataset = where.create_dataset(name, data=array)
            if attribute:
                dataset.attrs["unit"] = "x"
    check_outcome(path, config)


WORD_ALIGNED_FILES = ["text", "audio", "video", "y"]


@st.composite
def word_aligned_dirs(draw):
    """Well-formed files (left padded, labels (N,) or (N, 2)) but for 0 to 2 of them: missing,
    random in rank, dtype and contents, garbage bytes, or two datasets instead of one."""
    targets = draw(st.sampled_from([(), (2,)]))
    layout = {}
    for split in ("train", "val", "test"):
        rows = draw(st.sampled_from([6, 6, 6, 0, 1]))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        for name in WORD_ALIGNED_FILES:
            array = rng.normal(size=(rows, *targets) if name == "y" else (rows, 4, 3)).astype(np.float32)
            if name == "y":
                array = np.clip(array + 2.0, 1.0, 3.0)
            else:
                array[:, :2] = 0.0  # left padding
            layout[(name, split)] = ("good", array)
    for key in draw(st.lists(st.sampled_from(sorted(layout)), max_size=2, unique=True)):
        kind = draw(st.sampled_from(["random", "missing", "garbage", "two"]))
        layout[key] = (kind, draw(arrays(rows=6)) if kind == "random" else None)
    return layout


@FUZZ
@given(layout=word_aligned_dirs(), config=CONFIGS, asked=st.sampled_from([None, ("text", "audio"), ("video",)]))
def test_word_aligned_dirs_load_or_fail_in_one_line_naming_the_file(tmp_path_factory, layout, config, asked):
    folder = tmp_path_factory.mktemp("wa") / "pom"
    folder.mkdir()
    for (name, split), (kind, array) in layout.items():
        path = folder / f"{name}_{split}.h5"
        if kind == "missing":
            continue
        if kind == "garbage":
            path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 40)
            continue
        with h5py.File(path, "w") as handle:
            if kind == "two":
                handle.create_dataset("x", data=np.zeros(2))
                handle.create_dataset("y", data=np.zeros(2))
                continue
            if array.dtype.kind == "U":
                array = array.astype("S")
            handle.create_dataset("d1", data=array)
    if not (folder / "y_train.h5").is_file():
        return  # not a word-aligned directory: load_source reads it as a file (covered above)
    try:
        load_and_prepare(folder, config, modalities=asked)
    except (ValueError, FileNotFoundError) as error:
        message = str(error)
        assert "\n" not in message, message
        assert str(folder) in message, message


def test_the_fuzz_reaches_both_outcomes(tmp_path):
    """The generators are not vacuous: a well-formed file loads, a broken one is refused."""
    path = tmp_path / "ok.npz"
    rng = np.random.default_rng(0)
    np.savez(path, a=rng.normal(size=(12, 4, 3)).astype(np.float32), b=rng.normal(size=(12, 2)).astype(np.float32),
             label=rng.normal(size=12).astype(np.float32), split=np.array(["train"] * 6 + ["val", "test"] * 3))
    prepared = load_and_prepare(path, {"task": {"type": "sentiment"}, "padding": "auto", "nonfinite": "error"})
    assert prepared.features[0].shape == (12, 4, 3)
    np.savez(path, a=np.zeros((12, 4, 3), dtype="complex64"), b=np.zeros((12, 2)), label=np.zeros(12))
    with pytest.raises(ValueError, match=rf"^{path}: modality 'a' has dtype complex64"):
        load_and_prepare(path, {"task": {"type": "sentiment"}, "padding": "auto", "nonfinite": "error"})
