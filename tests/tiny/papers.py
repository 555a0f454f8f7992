"""Small files in the layouts the paper configurations (configs/papers/) name, written under
``<root>/data/`` as a user would lay them out below the repository, so that a copy of
configs/papers/ beside them reads them through its own relative paths.

Sizes are the releases' where the configurations depend on them (2,048-d bottom-up regions,
300-d GloVe and word-aligned text, 1,536 / 1,024 / 128-d captioning streams); counts are tiny.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np

from polyfuse.data.formats.bottom_up_tsv import import_bottom_up
from polyfuse.data.synthetic_flickr30k import write_flickr30k_like
from polyfuse.data.synthetic_vqa import write_vqa2_like

#: the word-aligned releases' feature sizes (text: 300-d GloVe; MOSI: COVAREP 74, Facet 47; POM: 43, 43)
WORD_ALIGNED_DIMS = {"cmu_mosi": (300, 74, 47), "pom": (300, 43, 43)}
POM_TRAITS = 16
#: the captioning streams of Low-Rank HOCA section 5.2
CAPTIONING_STREAMS = {"inception_resnet_v2": 1536, "i3d": 1024, "vggish": 128}
WORDS = ["a", "man", "woman", "dog", "cat", "is", "playing", "cooking", "riding", "the", "car", "guitar"]


def _ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def _captions(rng: np.random.Generator, ids: list[str]) -> dict[str, list[str]]:
    return {v: [" ".join(rng.choice(WORDS, size=6)) for _ in range(2)] for v in ids}


def write_glove(folder: Path, dim: int = 300, seed: int = 0) -> None:
    """``glove/glove.6B.300d.txt``: GloVe's text format for the words the generated sets use."""
    rng = np.random.default_rng(seed)
    words = sorted({*WORDS, "what", "color", "is", "there", "how", "many", "in", "picture", "?"})
    lines = [w + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=dim)) for w in words]
    (folder / "glove").mkdir(parents=True, exist_ok=True)
    (folder / "glove" / "glove.6B.300d.txt").write_text("\n".join(lines) + "\n")


def write_vqa2(folder: Path) -> None:
    """``vqa2/``: the official question and annotation JSONs of train2014 and val2014 and one
    ``trainval.hdf5`` with its JSON index, converted from the bottom-up TSV as docs/VQA.md does."""
    out = folder / "vqa2"
    written = write_vqa2_like(out, images={"train": 8, "val": 4}, questions_per_image=4, min_boxes=10, max_boxes=14,
                              formats=("tsv",))
    with open(out / "trainval.tsv", "wb") as handle:
        for split in ("train", "val"):
            handle.write(written[split]["tsv"].read_bytes())
    import_bottom_up(out / "trainval.tsv", out / "trainval.hdf5", progress=False)


def write_captioning(folder: Path, name: str, videos: int = 9, seed: int = 0) -> None:
    """``<name>/``: one HDF5 per stream with a (80, d) dataset per video id (the layout of
    ``polyfuse extract video``), ``captions.json`` and ``splits.json``."""
    rng = np.random.default_rng(seed)
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    ids = _ids("video", videos)
    for stream, dim in CAPTIONING_STREAMS.items():
        with h5py.File(out / f"{stream}.h5", "w") as handle:
            for video in ids:
                handle[video] = rng.normal(size=(80, dim)).astype(np.float32)
    (out / "captions.json").write_text(json.dumps(_captions(rng, ids)))
    (out / "splits.json").write_text(json.dumps({"train": ids[:5], "val": ids[5:7], "test": ids[7:]}))


def write_word_aligned(folder: Path, name: str, seed: int = 0) -> None:
    """``<name>/``: the MFN word-aligned release, ``{text,audio,video,y}_{train,valid,test}.h5``
    with one dataset ``d1`` each, sequences left-padded with zeros."""
    rng = np.random.default_rng(seed)
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    steps = 20
    for split, rows in (("train", 12), ("valid", 6), ("test", 6)):
        lengths = rng.integers(5, steps + 1, size=rows)
        for modality, dim in zip(("text", "audio", "video"), WORD_ALIGNED_DIMS[name], strict=True):
            values = rng.normal(size=(rows, steps, dim)).astype(np.float32)
            for row, length in enumerate(lengths):
                values[row, : steps - length] = 0.0  # the release pads on the left
            with h5py.File(out / f"{modality}_{split}.h5", "w") as handle:
                handle["d1"] = values
        labels = (rng.uniform(-3, 3, size=rows) if name == "cmu_mosi"
                  else rng.integers(1, 6, size=(rows, POM_TRAITS)).astype(np.float32))
        with h5py.File(out / f"y_{split}.h5", "w") as handle:
            handle["d1"] = labels.astype(np.float32)


def write_experts(folder: Path, name: str, experts: dict[str, int], videos: int = 9, seed: int = 0) -> None:
    """``<name>/``: one HDF5 per expert with a group ``features`` of per-video (T, d) arrays (the
    layout of collaborative experts' pickles written out), ``captions.json`` and the three
    id lists ``{train,val,test}.txt``; with several experts the last video lacks the last one
    (as CE's face or speech experts are missing for some videos)."""
    rng = np.random.default_rng(seed)
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    ids = _ids("video", videos)
    for k, (expert, dim) in enumerate(experts.items()):
        with h5py.File(out / f"{expert}.h5", "w") as handle:
            for video in ids:
                if 0 < k == len(experts) - 1 and video == ids[-1]:
                    continue
                handle[f"features/{video}"] = rng.normal(size=(int(rng.integers(3, 8)), dim)).astype(np.float32)
    (out / "captions.json").write_text(json.dumps(_captions(rng, ids)))
    for split, chosen in (("train", ids[:5]), ("val", ids[5:7]), ("test", ids[7:])):
        (out / f"{split}.txt").write_text("\n".join(chosen) + "\n")


def write_flickr30k_entities(folder: Path) -> None:
    """``flickr30k/``: the Flickr30k Entities release (``Flickr30kEntities/`` with Sentences,
    Annotations and the split files) and ban-vqa's adaptive features per split with their
    JSON indexes (here each split's file holds every image; the index finds its rows)."""
    out = folder / "flickr30k"
    written = write_flickr30k_like(out / "Flickr30kEntities", images=9, feature_dim=2048)
    for split in ("train", "val", "test"):
        shutil.copyfile(written.features, out / f"{split}.hdf5")
        shutil.copyfile(written.index, out / f"{split}_imgid2idx.json")
