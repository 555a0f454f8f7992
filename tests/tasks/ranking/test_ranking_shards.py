"""The shares of a retrieval batch and of an evaluation split under DDP: in rank order
they are the batch (the split) of one process, whatever the number of processes."""

from __future__ import annotations

import pytest
import torch

from polyfuse.tasks.ranking.data import DistinctVideoBatches, Shard, SplitChunks


@pytest.mark.parametrize(("size", "world"), [(8, 2), (7, 2), (3, 2), (10, 3), (5, 5)])
def test_shares_in_rank_order_are_the_batch(size, world):
    bounds = [Shard(rank, world).bounds(size) for rank in range(world)]
    sizes = Shard(0, world).sizes(size)
    assert [stop - start for start, stop in bounds] == sizes
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == size
    assert [i for start, stop in bounds for i in range(start, stop)] == list(range(size))


def test_every_process_draws_the_batches_of_one():
    captions_of = [[2 * v, 2 * v + 1] for v in range(11)]
    sampler = DistinctVideoBatches(captions_of, batch_size=4, seed=3)
    sampler.set_epoch(2)
    once = list(sampler)
    again = DistinctVideoBatches(captions_of, batch_size=4, seed=3)
    again.set_epoch(2)
    assert list(again) == once  # a function of the seed and the epoch: the same on every process
    assert [len(b) for b in once] == [4, 4, 3]
    again.min_batch = 4  # under DDP with 4 processes: a last batch of 3 cannot give each one a video
    assert list(again) == once[:2] and len(again) == 2


@pytest.mark.parametrize("whole_videos", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_split_chunks_of_every_process_cover_the_split_once(world, whole_videos):
    videos, captions, size = 7, 16, 3
    seen_videos, seen_captions = [], []
    for rank in range(world):
        chunks = SplitChunks(videos, captions, size, Shard(rank, world), whole_videos=whole_videos)
        rows = [chunks[k] for k in range(len(chunks))]
        assert all(len(c["video_rows"]) <= size and len(c["caption_rows"]) <= size for c in rows)
        share_videos = torch.cat([c["video_rows"] for c in rows]).tolist()
        if whole_videos:
            assert share_videos == list(range(videos))  # a cross-encoder's gallery: every video, in order
        else:
            seen_videos += share_videos
        seen_captions += torch.cat([c["caption_rows"] for c in rows]).tolist()
    assert seen_captions == list(range(captions))
    if not whole_videos:
        assert seen_videos == list(range(videos))
