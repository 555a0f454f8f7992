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


def _corpus_of(captions):
    from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus

    ids = [f"v{i}" for i in range(len(captions))]
    expert = ExpertFeatures("e", ids, torch.zeros(len(ids), 1, 2), torch.ones(len(ids), 1, dtype=torch.bool),
                            torch.ones(len(ids), dtype=torch.bool))
    return RetrievalCorpus.build({"e": expert}, {v: [c] for v, c in zip(ids, captions, strict=True)}, ids)


def test_recall_bounds_by_hand():
    """Captions 'a b together', 'a b apart' (twice), 'c d apart': a perfect caption ranker ties
    the two 'a b apart' videos (1/2 each at K = 1); a ranker blind to the relation ties the
    three 'a b' videos (1/3 each)."""
    from polyfuse.data.synthetic_retrieval import recall_bounds

    bounds = recall_bounds(_corpus_of(["a b together", "a b apart", "a b apart", "c d apart"]), ks=(1, 2, 5))
    assert bounds["caption_R@1"] == pytest.approx(100 * (1 + 0.5 + 0.5 + 1) / 4)
    assert bounds["events_R@1"] == pytest.approx(100 * (1 / 3 + 1 / 3 + 1 / 3 + 1) / 4)
    assert bounds["events_R@2"] == pytest.approx(100 * (2 / 3 + 2 / 3 + 2 / 3 + 1) / 4)
    assert bounds["caption_R@5"] == bounds["events_R@5"] == 100.0


def test_synthetic_source_options_split_and_bag_of_words_encoder():
    from polyfuse.data.synthetic_retrieval import (
        BagOfWordsEncoder,
        parse_synthetic_retrieval,
        synthetic_retrieval_split,
    )

    assert parse_synthetic_retrieval("synthetic:videos=50, noise=0.5")["noise"] == 0.5
    assert parse_synthetic_retrieval("synthetic")["videos"] == 1000
    with pytest.raises(ValueError, match=r"^bad synthetic option 'frames=3'; write key=value with keys: videos"):
        parse_synthetic_retrieval("synthetic:frames=3")
    with pytest.raises(ValueError, match=r"^synthetic option videos needs a int, got 'many'$"):
        parse_synthetic_retrieval("synthetic:videos=many")
    with pytest.raises(ValueError, match="at least 10 videos"):
        synthetic_retrieval_split("synthetic:videos=5")
    corpus, split = synthetic_retrieval_split("synthetic:videos=50,experts=3,steps=4,events=2,seed=1")
    assert [len(split[k]) for k in ("train", "val", "test")] == [40, 5, 5]
    assert split["train"] + split["val"] + split["test"] == corpus.video_ids and len(corpus.experts) == 3
    encoder = BagOfWordsEncoder(["apart", "together", "x0e1"])
    assert encoder(["x0e1 apart x0e1"]).sentence.tolist() == [[1.0, 0.0, 2.0]]
    with pytest.raises(ValueError, match="non-empty vocabulary"):
        BagOfWordsEncoder([])


def test_generator_defaults_bounds_and_reproducibility():
    corpus, vocabulary = make_synthetic_retrieval(400)
    assert list(corpus.experts) == ["expert0", "expert1"] and len(vocabulary) == 2 * 4 + 2
    expert = corpus.experts["expert0"]
    assert expert.name == "expert0" and expert.features.shape == (400, 8, 16)
    assert expert.mask.dtype == torch.bool and expert.mask.shape == (400, 8) and bool(expert.mask.all())
    assert expert.present.dtype == torch.bool and expert.present.shape == (400,) and bool(expert.present.all())
    # the steps without the event are N(0, 0.1^2) noise: the 7 lowest-norm steps of each video
    quiet = expert.features.norm(dim=-1).sort(dim=1).indices[:, :7]
    noise = expert.features.gather(1, quiet[..., None].expand(-1, -1, 16))
    assert abs(float(noise.std()) - 0.1) < 0.01
    same, _ = make_synthetic_retrieval(400, seed=0)  # seed 0 by default, and the seed alone fixes everything
    assert torch.equal(same.experts["expert1"].features, corpus.experts["expert1"].features)
    assert same.captions == corpus.captions
    other, _ = make_synthetic_retrieval(400, seed=1)
    assert not torch.equal(other.experts["expert0"].features, expert.features)
    smallest, _ = make_synthetic_retrieval(2, num_experts=2, steps=2, dim=1, events=1)  # every bound is valid
    assert smallest.experts["expert0"].features.shape == (2, 2, 1)
    message = r"^need num_videos >= 2, num_experts >= 2, steps >= 2, events >= 1, dim >= 1$"
    for options in ({"num_videos": 1}, {"num_experts": 1}, {"steps": 1}, {"events": 0}, {"dim": 0}):
        arguments = {"num_videos": 2, "num_experts": 2, "steps": 2, "dim": 1, "events": 1} | options
        with pytest.raises(ValueError, match=message):
            make_synthetic_retrieval(arguments.pop("num_videos"), **arguments)


def test_event_steps_hold_a_unit_prototype_plus_the_noise():
    clean, _ = make_synthetic_retrieval(60, dim=8, noise=0.0, seed=3)
    noisy, _ = make_synthetic_retrieval(60, dim=8, noise=0.3, seed=3)
    steps = clean.experts["expert0"].features.norm(dim=-1).argmax(dim=1)
    events = clean.experts["expert0"].features[torch.arange(60), steps]
    torch.testing.assert_close(events.norm(dim=-1), torch.ones(60))  # unit prototypes, nothing else
    first = clean.captions[0].split()[0]
    same_event = [i for i, c in enumerate(clean.captions) if c.split()[0] == first]
    torch.testing.assert_close(events[same_event], events[same_event[0]].expand(len(same_event), -1))
    noisy_events = noisy.experts["expert0"].features[torch.arange(60), steps]
    assert 0.1 < float((noisy_events - events).std()) < 0.5  # the noise is added at the event step too


def test_source_messages_and_options_reach_the_generator():
    from polyfuse.data.synthetic_retrieval import (
        BagOfWordsEncoder,
        parse_synthetic_retrieval,
        synthetic_retrieval_split,
    )

    with pytest.raises(ValueError, match=r"^not a synthetic source: 'real:videos=3'$"):
        parse_synthetic_retrieval("real:videos=3")
    with pytest.raises(ValueError, match=r"^bad synthetic option 'size=3'; write key=value with keys: videos, "
                                         r"experts, steps, dim, events, noise, seed$"):
        parse_synthetic_retrieval("synthetic:size=3")
    with pytest.raises(ValueError, match=r"^synthetic option videos needs a int, got '1=2'$"):
        parse_synthetic_retrieval("synthetic:videos=1=2")
    with pytest.raises(ValueError, match=r"^BagOfWordsEncoder needs a non-empty vocabulary$"):
        BagOfWordsEncoder([])
    corpus, split = synthetic_retrieval_split("synthetic:videos=10,experts=3,steps=3,dim=5,events=2,noise=0,seed=4")
    assert [len(split[k]) for k in ("train", "val", "test")] == [8, 1, 1]
    expected, _ = make_synthetic_retrieval(10, num_experts=3, steps=3, dim=5, events=2, noise=0.0, seed=4)
    assert corpus.captions == expected.captions
    for name in expected.experts:
        assert torch.equal(corpus.experts[name].features, expected.experts[name].features)
    with pytest.raises(ValueError, match="at least 10 videos"):
        synthetic_retrieval_split("synthetic:videos=9")
