"""Caption metrics (pycocoevalcap) against hand computation from the metrics' definitions."""

from __future__ import annotations

import math

import pytest
import torch

from polyfuse.metrics.captioning import CaptionMetrics, caption_metrics, java_available

REFERENCES = {"a": ["A man is walking."], "b": ["The chef cuts green onions slowly"]}
HYPOTHESES = {"a": "a man is running", "b": "the chef cuts green onions slowly"}


@pytest.mark.parametrize("java", [False, pytest.param(True, marks=pytest.mark.skipif(not java_available(), reason="no Java"))])
def test_scores_match_hand_computation(java: bool) -> None:
    scores = caption_metrics(REFERENCES, HYPOTHESES, java=java, meteor=False)
    # Corpus BLEU: clipped n-gram matches summed over both videos, equal lengths (BP = 1).
    p = [(3 + 6) / (4 + 6), (2 + 5) / (3 + 5), (1 + 4) / (2 + 4), (0 + 3) / (1 + 3)]
    for n in range(1, 5):
        assert scores[f"BLEU-{n}"] == pytest.approx(math.prod(p[:n]) ** (1 / n), abs=1e-6)
    # ROUGE-L (beta 1.2): video a has LCS 3 of 4 words both ways, video b matches exactly.
    assert scores["ROUGE-L"] == pytest.approx((0.75 + 1.0) / 2, abs=1e-9)
    # CIDEr-D: two videos with disjoint n-grams, so every idf is log 2 and cancels in the
    # cosine; video a shares 3/4, 2/3, 1/2, 0 of its 1..4-grams, same length (no penalty).
    video_a = 10 * (3 / 4 + 2 / 3 + 1 / 2 + 0) / 4
    assert scores["CIDEr-D"] == pytest.approx((video_a + 10) / 2, abs=1e-9)
    assert scores["METEOR"] is None


def test_brevity_penalty() -> None:
    scores = caption_metrics({"a": ["a man is walking"]}, {"a": "a man"}, java=False, meteor=False)
    assert scores["BLEU-1"] == pytest.approx(math.exp(1 - 4 / 2), abs=1e-6)


@pytest.mark.skipif(not java_available(), reason="METEOR needs Java")
def test_meteor_of_identical_captions_is_one() -> None:
    # One Java start (METEOR loads its paraphrase tables: seconds).
    same = caption_metrics({"a": ["a dog runs in the park"]}, {"a": "A dog runs in the park."})
    assert same["METEOR"] == pytest.approx(1.0) and same["tokenizer"] == "PTB (Java)"
    assert same["errors"] == {}


def test_without_java_meteor_is_an_error_and_the_rest_is_scored() -> None:
    with pytest.warns(RuntimeWarning, match="METEOR needs Java"):
        scores = caption_metrics(REFERENCES, HYPOTHESES, java=False)
    assert scores["METEOR"] is None and "Java" in scores["errors"]["METEOR"]
    assert scores["CIDEr-D"] > 0 and scores["tokenizer"] == "PTB (Python)"


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="no reference captions for video 'c'"):
        caption_metrics(REFERENCES, {"c": "a cat"}, java=False)
    with pytest.raises(ValueError, match="'a' needs a non-empty list"):
        caption_metrics({"a": []}, {"a": "a cat"}, java=False)
    with pytest.raises(ValueError, match="no generated captions"):
        caption_metrics(REFERENCES, {}, java=False)


def _pycocoevalcap_directly(references: dict, hypotheses: dict, meteor) -> dict[str, float]:
    """The MS COCO evaluation as its users call it: PTBTokenizer, then each scorer."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({v: [{"caption": c} for c in refs] for v, refs in references.items()})
    res = tokenizer.tokenize({v: [{"caption": c}] for v, c in hypotheses.items()})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    scores = {f"BLEU-{n + 1}": value for n, value in enumerate(bleu)}
    scores["METEOR"] = meteor.compute_score(gts, res)[0]
    scores["ROUGE-L"] = Rouge().compute_score(gts, res)[0]
    scores["CIDEr-D"] = Cider().compute_score(gts, res)[0]
    return scores


@pytest.mark.skipif(not java_available(), reason="the PTB tokeniser and METEOR need Java")
def test_a_caption_that_tokenises_to_nothing_is_scored_as_pycocoevalcap_scores_it(monkeypatch) -> None:
    import pycocoevalcap.meteor.meteor as meteor_module

    references = {**REFERENCES, "c": ["a dog runs in the park", "the dog is running"]}
    hypotheses = {**HYPOTHESES, "c": " . "}  # punctuation only: no token after PTB
    meteor = meteor_module.Meteor()  # one Java process (seconds to start) for both scorings
    monkeypatch.setattr(meteor_module, "Meteor", lambda: meteor)
    expected = _pycocoevalcap_directly(references, hypotheses, meteor)
    scores = caption_metrics(references, hypotheses)
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, abs=1e-12), name
    # By hand: 3 + 6 + 0 of 4 + 6 + 0 generated words match; the closest reference lengths
    # are 4, 6 and 4 (the shorter of 4 and 6 from 0), so BLEU's brevity penalty is exp(1 - 14 / 10).
    assert scores["BLEU-1"] == pytest.approx(9 / 10 * math.exp(1 - 14 / 10), abs=1e-6)


def _hand_scores() -> dict[str, float]:
    """The values of test_scores_match_hand_computation, as a dict."""
    p = [(3 + 6) / (4 + 6), (2 + 5) / (3 + 5), (1 + 4) / (2 + 4), (0 + 3) / (1 + 3)]
    scores = {f"BLEU-{n}": math.prod(p[:n]) ** (1 / n) for n in range(1, 5)}
    scores["ROUGE-L"] = (0.75 + 1.0) / 2
    scores["CIDEr-D"] = (10 * (3 / 4 + 2 / 3 + 1 / 2 + 0) / 4 + 10) / 2
    return scores


def test_caption_metric_over_batches_scores_the_whole_corpus() -> None:
    metric = CaptionMetrics(meteor=False, java=False)
    metric.update(["a"], ["a man is sitting"], [REFERENCES["a"]])
    metric.update(["b", "a"], [HYPOTHESES["b"], HYPOTHESES["a"]], [REFERENCES["b"], REFERENCES["a"]])
    scores = metric.compute()  # "a" twice: its last caption counts, as in a dict
    for key, value in _hand_scores().items():
        assert scores[key] == pytest.approx(value, abs=1e-6), key
    # CIDEr-D's document frequencies come from the whole corpus: one video alone scores 0
    alone = caption_metrics({"b": REFERENCES["b"]}, {"b": HYPOTHESES["b"]}, java=False, meteor=False)
    assert alone["CIDEr-D"] == 0.0
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"), pytest.raises(ValueError, match="no generated captions"):
        metric.compute()


def test_caption_metric_states_are_tensors_merged_as_processes_would_be() -> None:
    # two processes' states concatenated as DDP's gather does; non-ASCII text survives
    first, second = CaptionMetrics(meteor=False, java=False), CaptionMetrics(meteor=False, java=False)
    first.update(["vidéo a"], [HYPOTHESES["a"]], [REFERENCES["a"]])
    second.update(["b"], [HYPOTHESES["b"]], [REFERENCES["b"]])
    assert first.records[0].dtype == torch.uint8
    first.merge_state(second)
    scores = first.compute()
    for key, value in _hand_scores().items():
        assert scores[key] == pytest.approx(value, abs=1e-6), key
    direct = caption_metrics({"vidéo a": ["café crème"], "b": REFERENCES["b"]},
                             {"vidéo a": "un café crème", "b": HYPOTHESES["b"]}, java=False, meteor=False)  # fmt: skip
    metric = CaptionMetrics(meteor=False, java=False)
    metric.update(["vidéo a", "b"], ["un café crème", HYPOTHESES["b"]], [["café crème"], REFERENCES["b"]])
    assert metric.compute() == direct


def test_caption_metric_refuses_bad_input() -> None:
    metric = CaptionMetrics(meteor=False, java=False)
    with pytest.raises(ValueError, match="2 videos, 1 generated captions and 2 reference lists"):
        metric.update(["a", "b"], ["x"], [["x"], ["y"]])
    metric.update(["a", "c"], ["a man", "a cat"], [REFERENCES["a"], None])
    with pytest.raises(ValueError, match="no reference captions for video 'c'"):
        metric.compute()
