"""Expert feature importer: npz and HDF5 layouts, missing experts, clear errors."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from polyfuse.data.formats.experts import RetrievalCorpus, load_captions, load_expert, read_id_list

MSVD = Path(__file__).resolve().parents[3] / "shared" / "data" / "msvd"


def test_npz_with_lengths(tmp_path):
    path = tmp_path / "appearance.npz"
    features = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    np.savez(path, video_ids=np.array(["v1", "v0"]), features=features, lengths=np.array([3, 1]))
    expert = load_expert(path)
    assert expert.name == "appearance" and expert.dim == 2
    assert expert.mask.tolist() == [[True, True, True], [True, False, False]]
    assert torch.equal(expert.features[1, 0], torch.tensor([6.0, 7.0]))
    assert not expert.features[1, 1:].any()
    chosen = expert.select(["v0", "v9", "v1"])
    assert chosen.present.tolist() == [True, False, True]
    assert torch.equal(chosen.features[0, 0], torch.tensor([6.0, 7.0]))


def test_hdf5_per_video_with_nan_missing_and_wrong_dim(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "face.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("features/a", data=np.ones((2, 3), dtype=np.float32))
        f.create_dataset("features/b", data=np.full((3,), np.nan, dtype=np.float32))
    expert = load_expert(path)
    assert expert.video_ids == ["a", "b"]
    assert expert.present.tolist() == [True, False]
    assert expert.mask.tolist() == [[True, True], [False, False]]
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("features/a", data=np.ones((2, 3)))
        f.create_dataset("features/zz", data=np.ones((2, 4)))
    with pytest.raises(ValueError, match="'zz'"):
        load_expert(bad)


def test_pickle_refused_with_conversion(tmp_path):
    path = tmp_path / "audio.pkl"
    path.write_bytes(b"not read")
    with pytest.raises(ValueError, match=r"h5py\.File"):
        load_expert(path)


def test_duplicate_ids_and_caption_without_features(tmp_path):
    path = tmp_path / "e.npz"
    np.savez(path, video_ids=np.array(["a", "a"]), features=np.ones((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="duplicate video id 'a'"):
        load_expert(path)
    np.savez(path, video_ids=np.array(["a", "b"]), features=np.ones((2, 4), dtype=np.float32))
    expert = load_expert(path)
    with pytest.raises(ValueError, match="'c' has captions but no features"):
        RetrievalCorpus.build({"e": expert}, {"a": ["x"], "c": ["y"]}, ["a", "c"])
    captions = tmp_path / "captions.json"
    captions.write_text(json.dumps({"a": ["fine", " "]}))
    with pytest.raises(ValueError, match="caption 1 of video 'a' is empty"):
        load_captions(captions)
    ids = tmp_path / "ids.txt"
    ids.write_text("a\n\nb\n")
    assert read_id_list(ids) == ["a", "b"]


@pytest.mark.skipif(not (MSVD / "features_vgg.npz").is_file(), reason="MSVD folder absent")
def test_msvd_corpus_matches_the_files():
    from polyfuse.data.formats.msvd_retrieval import load_msvd_retrieval

    corpus, split = load_msvd_retrieval(MSVD, steps=20)
    assert len(corpus.video_ids) == 100 and len(corpus.captions) == 1674
    assert [len(split[k]) for k in ("train", "val", "test")] == [70, 10, 20]
    with np.load(MSVD / "features_vgg.npz") as data:
        first = data["vgg"][0].astype(np.float32)
    appearance = corpus.experts["vgg_appearance"].features[0]
    assert np.allclose(appearance[0].numpy(), first[:4].mean(axis=0), atol=1e-5)
    motion = corpus.experts["vgg_motion"].features[0]
    assert np.allclose(motion[0].numpy(), first[4:8].mean(axis=0) - first[:4].mean(axis=0), atol=1e-5)
