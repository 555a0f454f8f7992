"""Validation carved from training by whole groups, contextual windows, batches and
the sharded sampler."""

import numpy as np
import pytest
import torch

from polyfuse.data import (
    carve_groups,
    context_windows,
    load_source,
    prepare_data,
    resolve_splits,
)
from polyfuse.data.datamodule import FusionDataModule, ShardedShuffleSampler


def test_validation_is_carved_from_training_by_whole_groups():
    groups = np.repeat(np.arange(20), 5)  # 20 groups of 5 rows
    split = np.array(["train"] * 80 + ["test"] * 20)
    parts = resolve_splits(100, split=split, groups=groups, validation_fraction=0.25, test_fraction=0.2, seed=4)
    train, val, test = parts["train"], parts["val"], parts["test"]
    np.testing.assert_array_equal(test, np.arange(80, 100))  # the test rows are untouched
    assert np.intersect1d(val, test).size == 0
    assert np.intersect1d(groups[train], groups[val]).size == 0  # no group on both sides
    assert len(np.unique(groups[val])) == 4  # 25% of the 16 training groups
    assert np.union1d(train, val).tolist() == list(range(80))
    again = resolve_splits(100, split=split, groups=groups, validation_fraction=0.25, test_fraction=0.2, seed=4)
    np.testing.assert_array_equal(again["val"], val)
    other = resolve_splits(100, split=split, groups=groups, validation_fraction=0.25, test_fraction=0.2, seed=5)
    assert not np.array_equal(other["val"], val)


def test_split_validation_rows_are_used_when_present():
    split = np.array(["train"] * 6 + ["dev"] * 2 + ["test"] * 2)
    parts = resolve_splits(10, split=split, groups=None, validation_fraction=0.5, test_fraction=0.2, seed=0)
    assert parts["val"].tolist() == [6, 7]


def test_without_split_test_and_validation_are_carved_by_groups():
    groups = np.repeat(np.arange(10), 3)
    parts = resolve_splits(30, split=None, groups=groups, validation_fraction=0.25, test_fraction=0.2, seed=0)
    sets = [set(groups[parts[k]]) for k in ("train", "val", "test")]
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])
    assert sum(len(parts[k]) for k in parts) == 30


def test_carving_needs_two_groups():
    with pytest.raises(ValueError, match="out of 1 group"):
        carve_groups(np.arange(5), np.zeros(5, dtype=int), 0.2, 0)


def test_context_windows_by_hand():
    # Two videos, rows shuffled in the table; order by start time.
    groups = np.array(["a", "b", "a", "a", "b", "a", "a"])
    start = np.array([3.0, 1.0, 0.0, 4.0, 0.5, 1.0, 2.0])
    # video a in time order: rows 2, 5, 6, 0, 3; video b: rows 4, 1
    windows, centre = context_windows(np.arange(7), groups, start, window=3)
    expected = {
        2: ([2, 5, 6], 0),  # first of a: window starts at the video start
        5: ([2, 5, 6], 1),
        6: ([5, 6, 0], 1),
        0: ([6, 0, 3], 1),
        3: ([6, 0, 3], 2),  # last of a
        4: ([4, 1, -1], 0),  # video b is shorter than the window: padded
        1: ([4, 1, -1], 1),
    }
    for row, (window, position) in expected.items():
        assert windows[row].tolist() == window, row
        assert centre[row] == position
        assert windows[row][centre[row]] == row
    whole, _ = context_windows(np.arange(7), groups, start, window=None)
    assert whole.shape == (7, 5)


def test_windows_stay_inside_their_partition(tmp_path):
    n = 60
    rng = np.random.default_rng(0)
    raw = {
        "a": rng.normal(size=(n, 3)).astype(np.float32),
        "b": rng.normal(size=(n, 2)).astype(np.float32),
        "label": rng.uniform(-3, 3, n).astype(np.float32),
        "video": np.repeat(np.arange(6), 10).astype(str),
        "start": rng.permutation(n).astype(np.float32),
        "split": np.array(["train"] * 40 + ["test"] * 20),
    }
    np.savez(tmp_path / "ctx.npz", **raw)
    config = {
        "modalities": ["a", "b"], "split": "split", "validation_fraction": 0.25,
        "context": {"group_by": "video", "order_by": "start", "window": 4},
    }
    data = prepare_data(load_source(str(tmp_path / "ctx.npz")), config, {"type": "sentiment"}, label_kind="score")
    for key, part in data.splits.items():
        real = part.windows[part.windows >= 0]
        assert np.isin(real, part.rows).all(), key
        for row, window, position in zip(part.rows, part.windows, part.centre, strict=True):
            members = window[window >= 0]
            assert window[position] == row
            assert (raw["video"][members] == raw["video"][row]).all()
            assert np.all(np.diff(raw["start"][members]) > 0)  # ordered by start
    module = FusionDataModule(data, batch_size=8)
    batch = next(iter(module.loader("val")))
    assert [x.shape[-1] for x in batch["inputs"]] == [3, 2]
    assert batch["inputs"][0].shape[1] == 4 and batch["masks"][0].dtype == torch.bool
    rows = batch["row"].numpy()
    centre_features = batch["inputs"][0][torch.arange(len(rows)), batch["centre"]].numpy()
    np.testing.assert_allclose(centre_features, data.features[0][rows, 0])
    with pytest.raises(ValueError, match="contextual mode needs one vector per row"):
        raw["a"] = raw["a"][:, None, :].repeat(2, axis=1)
        np.savez(tmp_path / "seq.npz", **raw)
        prepare_data(load_source(str(tmp_path / "seq.npz")), config, {"type": "sentiment"}, label_kind="score")


def test_batches_are_cut_to_the_longest_real_sequence():
    data = prepare_data(
        load_source("synthetic:samples=40,lengths=12/12/12,min_length_fraction=0.5"),
        {"modalities": ["m0", "m1", "m2"], "split": "split"}, {"type": "classification"}, label_kind="class")
    batch = next(iter(FusionDataModule(data, batch_size=4).loader("train")))
    for x, mask in zip(batch["inputs"], batch["masks"], strict=True):
        assert x.shape[1] == int(mask.sum(dim=1).max())
        assert torch.all(x[~mask] == 0)


def test_sharded_sampler_splits_the_single_process_batches():
    size, batch = 24, 8
    single = list(ShardedShuffleSampler(size, seed=3))
    shards = [list(ShardedShuffleSampler(size, seed=3, rank=r, world=2)) for r in range(2)]
    for step in range(size // batch):
        together = single[step * batch : (step + 1) * batch]
        halves = [s[step * batch // 2 : (step + 1) * batch // 2] for s in shards]
        assert sorted(halves[0] + halves[1]) == sorted(together)
    sampler = ShardedShuffleSampler(size, seed=3)
    sampler.set_epoch(1)
    assert list(sampler) != single and sorted(sampler) == list(range(size))
    uneven = [list(ShardedShuffleSampler(7, seed=0, rank=r, world=2)) for r in range(2)]
    assert len(uneven[0]) == len(uneven[1]) == 4  # padded like DistributedSampler
    evaluation = [list(ShardedShuffleSampler(7, seed=0, rank=r, world=2, shuffle=False)) for r in range(2)]
    assert sorted(evaluation[0] + evaluation[1]) == list(range(7))  # nothing padded or repeated
