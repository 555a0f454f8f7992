"""Synthetic retrieval generator: the caption words decode the planted events."""

import pytest
import torch

from polyfuse.data.synthetic_retrieval import bag_of_words, make_synthetic_retrieval


def test_captions_name_the_planted_events_and_relation():
    corpus, vocabulary = make_synthetic_retrieval(40, num_experts=3, steps=5, dim=32, events=3, noise=0.01, seed=2)
    assert len(corpus.captions) == 40 and corpus.caption_video == corpus.video_ids
    for i, caption in enumerate(corpus.captions):
        words = caption.split()
        steps = []
        for j in range(3):
            x = corpus.experts[f"expert{j}"].features[i]
            t = int(x.norm(dim=-1).argmax())  # the step carrying the (unit-norm) event
            steps.append(t)
            assert words[j].startswith(f"x{j}e")
        assert words[3] == ("together" if steps[0] == steps[1] else "apart")
    # the same event word means the same planted prototype (up to the noise)
    by_word = {}
    for i, caption in enumerate(corpus.captions):
        x = corpus.experts["expert0"].features[i]
        event = x[int(x.norm(dim=-1).argmax())]
        by_word.setdefault(caption.split()[0], []).append(event)
    for vectors in by_word.values():
        assert torch.allclose(vectors[0], vectors[-1], atol=0.1)
    counts = bag_of_words(corpus.captions[:2], vocabulary)
    assert counts.sum(1).tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match="unknown word 'zebra'"):
        bag_of_words(["zebra"], vocabulary)
