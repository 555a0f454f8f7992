"""Captioning data: feature files keyed by video id, captions, splits, tokeniser, vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from polyfuse.data.formats.captioning import (
    Vocabulary,
    load_captions,
    load_splits,
    load_video_features,
)
from polyfuse.metrics.captioning import java_available
from polyfuse.text import ptb_tokenize

MSVD = Path(__file__).resolve().parents[4] / "shared" / "data" / "msvd"


def test_ptb_tokenize_by_hand() -> None:
    assert ptb_tokenize("A man doesn't cut the T-shirt (slowly).") == [
        "a", "man", "does", "n't", "cut", "the", "t-shirt", "-lrb-", "slowly", "-rrb-"]
    assert ptb_tokenize('He said, "it\'s 3.5 kg!"') == ["he", "said", "it", "'s", "3.5", "kg"]


@pytest.mark.skipif(not (MSVD / "captions.json").is_file() or not java_available(), reason="needs MSVD and Java")
def test_ptb_tokenize_agrees_with_the_java_tokeniser_on_msvd() -> None:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    captions = [c for cs in json.loads((MSVD / "captions.json").read_text()).values() for c in cs]
    java = PTBTokenizer().tokenize({str(i): [{"caption": c}] for i, c in enumerate(captions)})
    differ = [c for i, c in enumerate(captions) if java[str(i)][0].split() != ptb_tokenize(c)]
    # All 1,674 agree. Known differences elsewhere (a few captions of captions_train_nofeat.json):
    # abbreviations keep their final dot in Java ("mt."), Devanagari combining marks, "o'lantern".
    assert differ == []


def test_npz_keyed_by_id_h5_groups_and_id_arrays(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = {"v1": rng.normal(size=(4, 3)).astype(np.float32), "v2": rng.normal(size=(2, 3)).astype(np.float32)}
    np.savez(tmp_path / "keyed.npz", **x)
    keyed = load_video_features(tmp_path / "keyed.npz")
    assert keyed.name == "keyed" and keyed.dim == 3 and keyed.max_length == 4
    np.testing.assert_array_equal(keyed.arrays["v2"], x["v2"])
    with h5py.File(tmp_path / "extract.h5", "w") as handle:
        for video, array in x.items():
            handle.create_dataset(f"motion/{video}", data=array[:, :2])
    motion = load_video_features("extract.h5#motion", base=tmp_path, stride=2)
    assert motion.name == "motion"
    np.testing.assert_array_equal(motion.arrays["v1"], x["v1"][::2, :2])
    stacked = rng.normal(size=(2, 5, 6)).astype(np.float16)
    np.savez(tmp_path / "ids.npz", video_ids=np.array(["a", "b"]), vgg=stacked, lengths=np.array([5, 3]))
    ids = load_video_features(tmp_path / "ids.npz#vgg")
    assert ids.arrays["b"].shape == (3, 6) and ids.arrays["b"].dtype == np.float32
    np.testing.assert_array_equal(ids.arrays["a"], stacked[0].astype(np.float32))


def test_bad_feature_files_name_file_and_video(tmp_path: Path) -> None:
    np.savez(tmp_path / "short.npz", video_ids=np.array(["a", "b", "c"]), vgg=np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match=r"short.npz#vgg: video_ids has 3 entries but the features have 2 rows"):
        load_video_features(tmp_path / "short.npz#vgg")
    np.savez(tmp_path / "lengths.npz", video_ids=np.array(["a", "b"]), vgg=np.zeros((2, 4, 3)), lengths=np.array([4, 9]))
    with pytest.raises(ValueError, match=r"lengths disagree .* video 'b' \(length 9"):
        load_video_features(tmp_path / "lengths.npz#vgg")
    np.savez(tmp_path / "dims.npz", a=np.zeros((2, 3)), b=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="feature sizes disagree"):
        load_video_features(tmp_path / "dims.npz")
    np.savez(tmp_path / "nan.npz", a=np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="video 'a' has NaN"):
        load_video_features(tmp_path / "nan.npz")


def test_caption_formats_and_empty_caption(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(json.dumps({"v1": ["A dog.", "a dog runs"], "v2": ["cat"]}))
    (tmp_path / "course.json").write_text(json.dumps([{"id": "v1.avi", "caption": ["A dog."]}]))
    (tmp_path / "msrvtt.json").write_text(json.dumps({"sentences": [{"video_id": "video7", "caption": "a car"}]}))
    (tmp_path / "c.csv").write_text("video_id,caption\nv1,A dog.\nv1,a dog runs\n")
    assert load_captions(tmp_path / "c.json") == {"v1": ["A dog.", "a dog runs"], "v2": ["cat"]}
    assert load_captions(tmp_path / "course.json") == {"v1": ["A dog."]}
    assert load_captions(tmp_path / "msrvtt.json") == {"video7": ["a car"]}
    assert load_captions(tmp_path / "c.csv") == {"v1": ["A dog.", "a dog runs"]}
    (tmp_path / "empty.json").write_text(json.dumps({"v1": ["A dog."], "v9": [" . "]}))
    with pytest.raises(ValueError, match=r"empty.json: video 'v9' has an empty caption"):
        load_captions(tmp_path / "empty.json")


def test_splits_and_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"train": ["a"], "val": ["b"], "test": ["c", "a"]}))
    with pytest.raises(ValueError, match="'a' is in both 'train' and 'test'"):
        load_splits(tmp_path / "s.json")
    vocab = Vocabulary.build(["A dog runs.", "a dog sits", "The cat"], min_count=2)
    assert vocab.words == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "dog"]
    assert vocab.encode("A cat, a dog!", max_words=3) == [1, 4, 3, 4, 2]
    assert vocab.decode([4, 5, 2, 4]) == "a dog"


def test_the_replayed_sampler_gives_the_order_of_a_loader_built_once():
    """Oracle: torch's own shuffling loader with a seeded generator, iterated epoch after
    epoch; the sampler gives each epoch's order from (seed, epoch) alone."""
    import torch
    from torch.utils.data import DataLoader

    from polyfuse.tasks.captioning.data import ReplayedShuffleSampler

    loader = DataLoader(list(range(13)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    once = [[i for batch in loader for i in batch.tolist()] for _ in range(4)]
    sampler = ReplayedShuffleSampler(13, seed=7)
    for epoch in (3, 0, 2, 1):  # any order: a resumed run starts late
        sampler.set_epoch(epoch)
        assert list(sampler) == once[epoch]
    assert len({tuple(order) for order in once}) == 4
