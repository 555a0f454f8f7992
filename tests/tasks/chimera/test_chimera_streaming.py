"""Chimera's batches read the video expert from its file in the collate, padded to the
expert's longest sequence in the file (its masking draws depend on that width): checked
against numpy reads of the file."""

import json

import numpy as np
import torch

from polyfuse.tasks.chimera.spec import ChimeraData, _Batches
from polyfuse.tasks.ranking.data import CORPUS_SPLITS, Shard, load_corpus
from polyfuse.tasks.ranking.spec import select_splits

IDS = [f"v{i}" for i in range(6)]


def test_chimera_batches_hold_the_files_steps_padded_to_the_files_width(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 5, 3)).astype(np.float32)
    lengths = np.array([2, 5, 1, 3, 4, 2])
    values[2] = np.nan  # v2 lacks the expert
    np.savez(tmp_path / "app.npz", video_ids=np.array(IDS), features=values, lengths=lengths)
    np.savez(
        tmp_path / "mot.npz", video_ids=np.array(IDS), features=np.ones((6, 2), np.float32)
    )  # v2 has this one
    (tmp_path / "captions.json").write_text(json.dumps({v: [f"caption {v}"] for v in IDS}))
    for name, ids in {"train": IDS[:4], "val": IDS[4:5], "test": IDS[5:]}.items():
        (tmp_path / f"{name}.txt").write_text("\n".join(ids))
    section = {
        "experts": {"app": str(tmp_path / "app.npz"), "mot": str(tmp_path / "mot.npz")},
        "captions": str(tmp_path / "captions.json"),
        "splits": {n: str(tmp_path / f"{n}.txt") for n in CORPUS_SPLITS},
    }
    corpus, split = load_corpus(section)
    splits = select_splits(corpus, split, CORPUS_SPLITS)
    tokens = {
        name: (torch.zeros(len(s.captions), 2, 4), torch.ones(len(s.captions), 2, dtype=torch.bool))
        for name, s in splits.items()
    }
    collate = _Batches(ChimeraData(splits, "app", 4, tokens, None))

    def want(rows):  # the oracle: the file's rows, zero past each length and for v2
        real = (np.arange(5) < lengths[rows, None]) & (np.array(rows) != 2)[:, None]
        return np.where(real[..., None], values[rows], 0.0), real

    pairs = [(3, 3), (2, 2), (0, 0), (1, 1)]  # train rows are the first four ids
    batch = collate("train", pairs, Shard(1, 2))  # process 1 of 2: the last two pairs' steps
    np.testing.assert_array_equal(batch["steps"].numpy(), want([0, 1])[0])
    np.testing.assert_array_equal(batch["video_mask"].numpy(), want([3, 2, 0, 1])[1])
    chunk = collate(
        "train", {"video_rows": torch.tensor([2, 1]), "caption_rows": torch.tensor([0])}
    )
    np.testing.assert_array_equal(chunk["steps"].numpy(), want([2, 1])[0])
    np.testing.assert_array_equal(chunk["video_mask"].numpy(), want([2, 1])[1])
