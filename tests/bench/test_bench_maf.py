"""Tests for polyfuse.bench.maf: the pieces of the Eq. 19 captioning benchmark.

References: entropy by hand, scikit-learn's PCA for the projection, and the
frame-difference definition written out; one end-to-end run on a tiny synthetic
MSVD-shaped folder that the test writes.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from polyfuse.bench import maf as bench_maf


def test_attention_entropy_by_hand():
    attention = torch.tensor([[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    got = bench_maf.attention_entropy(attention)
    assert abs(float(got[0]) - expected) < 1e-12 and float(got[1]) == 0.0
    uniform = torch.full((1, 20), 1 / 20, dtype=torch.float64)
    assert abs(float(bench_maf.attention_entropy(uniform)[0]) - math.log(20)) < 1e-12


def test_streams_are_the_pca_projection_and_its_frame_differences():
    decomposition = pytest.importorskip("sklearn.decomposition")
    rng = np.random.default_rng(0)
    vgg = rng.random((6, 12, 10)).astype(np.float16)
    appearance, difference = bench_maf._streams(vgg, stride=3, pca_dim=3, fit_rows=[0, 1, 2, 3])
    rows = vgg[:, ::3].astype(np.float64)  # (6, 4, 10)
    pca = decomposition.PCA(n_components=3, svd_solver="full").fit(rows[:4].reshape(-1, 10))
    expected = pca.transform(rows.reshape(-1, 10)).reshape(6, 4, 3)
    got = appearance.double().numpy()
    signs = np.sign((got * expected).sum(axis=(0, 1)))  # a direction's sign is arbitrary
    np.testing.assert_allclose(got * signs, expected, atol=1e-4)
    np.testing.assert_allclose(difference.numpy(), got[:, 1:] - got[:, :-1], atol=1e-6)


def test_vocabulary_is_the_captioning_tasks():
    # bench maf builds its vocabulary like task.type captioning: PTB tokens, count >= min_count.
    vocabulary = bench_maf.Vocabulary.build(["a dog", "a cat", "A dog."], min_count=2)
    assert vocabulary.words == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "dog"]
    assert vocabulary.encode("a cat dog runs", max_words=3) == [1, 4, 3, 5, 2]
    assert vocabulary.decode([4, 3, 5, 2, 4]) == "a <unk> dog"


def test_greedy_decoding_bans_unknown_unless_allowed():
    # As task.type captioning (captioning.allow_unknown: false): a decoder whose output
    # bias makes <unk> the best word everywhere must still never emit it by default.
    torch.manual_seed(0)
    vocabulary = bench_maf.Vocabulary.build(["a dog runs", "a cat sits"], min_count=1)
    unknown = vocabulary.index["<unk>"]
    settings = dataclasses.replace(bench_maf.QUICK, max_decode_length=6)
    model = bench_maf._captioner(len(vocabulary.words), settings, "log", [3, 3], 5).eval()
    with torch.no_grad():
        model.decoder.state_output.bias[unknown] = 1e4
        inputs = bench_maf._encode(model, [torch.randn(2, 3, 5), torch.randn(2, 3, 5)])
        banned, _ = bench_maf._generate(model, inputs, vocabulary, settings)
        allowed, _ = bench_maf._generate(
            model, inputs, vocabulary, dataclasses.replace(settings, allow_unknown=True))
    assert (allowed == unknown).all()  # the bias does make <unk> the greedy choice
    assert not (banned == unknown).any()
    assert banned.shape == (2, 6)


def test_end_to_end_on_a_tiny_synthetic_folder(tmp_path):
    pytest.importorskip("pycocoevalcap")
    rng = np.random.default_rng(1)
    ids = [f"vid{i}" for i in range(8)]
    np.savez(tmp_path / "features_vgg.npz", video_ids=np.array(ids),
             vgg=rng.random((8, 16, 24)).astype(np.float16))
    words = ["a man is cooking", "a dog runs", "a woman is slicing an onion"]
    captions = {v: [words[i % 3], words[(i + 1) % 3]] for i, v in enumerate(ids)}
    (tmp_path / "captions.json").write_text(json.dumps(captions))
    (tmp_path / "splits.json").write_text(json.dumps({"train": ids[:6], "val": [],
                                                      "test": ids[6:]}))
    settings = dataclasses.replace(bench_maf.QUICK, data_dir=tmp_path, frame_stride=4,
                                   pca_dim=4, min_count=1, combinations=("literal",),
                                   meteor=False)
    payload = bench_maf.run_maf_bench(settings)
    assert payload["data"] == {"train_videos": 6, "test_videos": 2, "train_captions": 12,
                               "vocabulary": 4 + 10, "appearance_steps": 4,
                               "difference_steps": 3}
    literal = payload["variants"]["literal"]
    # Eq. 19 as printed with theta near 1: softmax of values in [0, 2] over 4 steps
    assert literal["attention_entropy"]["appearance"]["relative"] > 0.9
    assert 0.0 <= literal["scores"]["BLEU-4"] <= 1.0 and literal["scores"]["CIDEr-D"] >= 0.0
    assert literal["captions_with_unknown"] == 0
    assert literal["scores"]["METEOR"] is None and "METEOR not computed" in literal["scores"][
        "note"]
    with pytest.raises(FileNotFoundError, match=r"lacks features_vgg\.npz"):
        bench_maf.run_maf_bench(dataclasses.replace(settings, data_dir=tmp_path / "none"))


def test_cli_allow_unknown_reaches_the_settings(monkeypatch):
    from polyfuse.cli import bench as bench_cli
    from polyfuse.cli.main import build_parser

    seen = []
    monkeypatch.setattr(bench_maf, "run_maf_bench", lambda settings, progress=None: seen.append(settings) or {})
    for argv, expected in ((["bench", "maf", "--preset", "quick"], False),
                           (["bench", "maf", "--preset", "quick", "--allow-unknown"], True)):
        bench_cli._maf(build_parser().parse_args(argv))
        assert seen[-1].allow_unknown is expected
    assert bench_maf.FULL.allow_unknown is False  # the captioning task's default
