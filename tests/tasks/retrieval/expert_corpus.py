"""A small corpus of expert files (two experts), captions and splits, the clips of its
videos, and a ``task.type retrieval`` configuration file that reads them: what the tests
of the retrieval commands (tests/cli/test_retrieval_cli.py, test_cli_hostile.py) train on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

#: the caption words; captions are three of them in a video's own order
WORDS = ["dog", "cat", "car", "man", "runs", "sits", "jumps", "red", "big", "small"]
IDS = [f"v{i}" for i in range(24)]
SPLIT = {"train": IDS[:12], "val": IDS[12:16], "test": IDS[16:]}


def write_expert_corpus(folder: Path, *, one_word: bool = False) -> dict:
    """Two expert files (``app`` of 5, ``mot`` of 3 features), two captions per video (one
    word each with ``one_word``), splits 12 / 4 / 8; the ``retrieval`` section's corpus keys."""
    rng = np.random.default_rng(0)
    for name, dim in (("app", 5), ("mot", 3)):
        np.savez(folder / f"{name}.npz", video_ids=np.array(IDS), features=rng.normal(size=(24, 4, dim)).astype(np.float32))
    captions = {}
    for i, video in enumerate(IDS):
        if one_word:
            captions[video] = [WORDS[i % len(WORDS)], WORDS[(i + 3) % len(WORDS)]]
        else:
            captions[video] = [f"{WORDS[i % 4]} {WORDS[4 + i % 3]} {WORDS[7 + i % 3]}",
                               f"a {WORDS[7 + i % 3]} {WORDS[i % 4]} {WORDS[4 + (i + 1) % 3]}"]
    (folder / "captions.json").write_text(json.dumps(captions))
    for name, ids in SPLIT.items():
        (folder / f"{name}.txt").write_text("\n".join(ids) + "\n")
    return {"experts": {"app": str(folder / "app.npz"), "mot": str(folder / "mot.npz")},
            "captions": str(folder / "captions.json"), "splits": {n: str(folder / f"{n}.txt") for n in SPLIT}}


def retrieval_config_file(folder: Path, *, one_word: bool = False, epochs: int = 2, **section) -> Path:
    """``folder / "retrieval.yaml"``: the corpus of :func:`write_expert_corpus`, MiniLM
    captions, the mean of experts (``section`` overrides), runs under ``folder / "runs"``."""
    config = {
        "output_dir": str(folder / "runs"),
        "task": {"type": "retrieval"},
        "retrieval": {**write_expert_corpus(folder, one_word=one_word), "text": "minilm",
                      "embed_dim": 8, "hidden_dim": 8, **section},
        "model": {"fusion": "mean"},
        "data": {"batch_size": 6, "eval_batch_size": 8},
        "trainer": {"max_epochs": epochs, "patience": 0, "accelerator": "cpu", "progress_bar": False, "quiet": True,
                    "num_threads": 1},
    }
    path = folder / "retrieval.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def write_clips(folder: Path, ids) -> Path:
    """``folder / "clips"``: a one-frame FFV1 clip per video id, each of its own grey level."""
    import av

    clips = folder / "clips"
    clips.mkdir(exist_ok=True)
    for k, video in enumerate(ids):
        with av.open(str(clips / f"{video}.avi"), "w") as container:
            stream = container.add_stream("ffv1", rate=5)
            stream.width, stream.height, stream.pix_fmt = 16, 16, "bgr0"
            level = np.full((16, 16, 3), 20 * k % 256, dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(level, format="rgb24")))
            container.mux(stream.encode())
    return clips
