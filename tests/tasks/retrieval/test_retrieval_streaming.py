"""Retrieval batches read their experts from the files in the collate: the values are
the files' (checked against numpy reads of them), and a loader with a worker process
gives the batches of one without (the sampler draws in the main process)."""

import json

import numpy as np
import torch

from polyfuse.tasks.ranking.data import CORPUS_SPLITS, RetrievalDataModule, load_corpus
from polyfuse.tasks.ranking.spec import select_splits
from polyfuse.tasks.retrieval.spec import RetrievalData, _Batches

IDS = [f"v{i}" for i in range(10)]


def _corpus_files(folder):
    """Two experts of different step counts; ``mot`` lacks v3 (all NaN) and v7 (not in its file)."""
    rng = np.random.default_rng(0)
    app = rng.normal(size=(10, 5, 4)).astype(np.float32)
    app_lengths = rng.integers(1, 6, size=10)
    np.savez(folder / "app.npz", video_ids=np.array(IDS), features=app, lengths=app_lengths)
    mot_ids = [v for v in IDS if v != "v7"]
    mot = rng.normal(size=(9, 3, 2)).astype(np.float32)
    mot[mot_ids.index("v3")] = np.nan
    np.savez(folder / "mot.npz", video_ids=np.array(mot_ids), features=mot)
    (folder / "captions.json").write_text(
        json.dumps({v: [f"caption {v}", f"other {v}"] for v in IDS})
    )
    split = {"train": IDS[:7], "val": IDS[7:8], "test": IDS[8:]}
    for name, ids in split.items():
        (folder / f"{name}.txt").write_text("\n".join(ids))
    section = {
        "experts": {"app": str(folder / "app.npz"), "mot": str(folder / "mot.npz")},
        "captions": str(folder / "captions.json"),
        "splits": {n: str(folder / f"{n}.txt") for n in split},
    }
    return section, (app, app_lengths), (mot_ids, mot)


def _module(section, workers):
    corpus, split = load_corpus(section)
    splits = select_splits(corpus, split, CORPUS_SPLITS)
    prepared = RetrievalData(splits, dict.fromkeys(splits), 4, None)
    return RetrievalDataModule(
        splits, _Batches(prepared), batch_size=3, eval_batch_size=4, seed=5, num_workers=workers
    ), splits


def test_batches_hold_the_files_values_and_do_not_depend_on_the_workers(tmp_path):
    section, (app, app_lengths), (mot_ids, mot) = _corpus_files(tmp_path)
    alone, splits = _module(section, 0)
    with_worker, _ = _module(section, 1)
    train = splits["train"].video_ids
    for epoch in (0, 1):
        alone.sampler.set_epoch(epoch)
        with_worker.sampler.set_epoch(epoch)
        batches = list(alone.train_dataloader())
        assert len(batches) == 2
        for batch, other in zip(batches, with_worker.train_dataloader(), strict=True):
            assert batch["captions"] == other["captions"]
            for key in ("features", "masks"):
                for x, y in zip(batch[key], other[key], strict=True):
                    assert torch.equal(x, y)
            assert torch.equal(batch["present"], other["present"])
            videos = [caption.split()[1] for caption in batch["captions"]]
            # the oracle: the arrays numpy reads from the files, padded to each file's T
            rows = [IDS.index(v) for v in videos]
            want_app = app[rows] * (np.arange(5) < app_lengths[rows, None])[..., None]
            np.testing.assert_array_equal(batch["features"][0].numpy(), want_app)
            np.testing.assert_array_equal(
                batch["masks"][0].numpy(), np.arange(5) < app_lengths[rows, None]
            )
            has_mot = [v in mot_ids and v != "v3" for v in videos]
            want_mot = np.stack(
                [
                    mot[mot_ids.index(v)] if h else np.zeros((3, 2), np.float32)
                    for v, h in zip(videos, has_mot, strict=True)
                ]
            )
            np.testing.assert_array_equal(batch["features"][1].numpy(), want_mot)
            assert batch["present"].tolist() == [[True, h] for h in has_mot]
            assert set(videos) <= set(train)
    chunk = next(iter(alone.loader("test")))
    assert chunk["video_rows"].tolist() == [0, 1]
    np.testing.assert_array_equal(chunk["features"][0].numpy()[:, :1], app[8:10, :1])
