"""Grounding Recall@K on synthetic boxes, and the Flickr30k Entities parsers on hand-written files."""

from __future__ import annotations

import pytest
import torch

from polyfuse.data.formats.flickr30k import parse_boxes, parse_sentence
from polyfuse.metrics.grounding import grounding_recall, phrase_scores

# Candidates: box 0 matches phrase 0 exactly, box 1 overlaps it with IoU 1/3, box 2 is
# far away, box 3 covers the union of phrase 1's two boxes.
BOXES = torch.tensor([[0, 0, 2, 2], [1, 0, 3, 2], [10, 10, 11, 11], [4, 4, 8, 6]], dtype=torch.float32)
TRUTHS = [torch.tensor([[0.0, 0, 2, 2]]), torch.tensor([[4.0, 4, 6, 6], [6.0, 4, 8, 6]])]


def test_recall_hand_computed():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.0], [0.9, 0.8, 0.0, 0.7]])
    # phrase 0: ranking 1, 2, 0, 3 -> correct box 0 at rank 3; phrase 1 (union box) -> box 3 at rank 3
    result = grounding_recall(scores, BOXES, TRUTHS, ks=(1, 2, 3), merge="union")
    assert result == {1: 0.0, 2: 0.0, 3: 1.0}
    scores[0, 0] = 1.0  # box 0 first for phrase 0
    assert grounding_recall(scores, BOXES, TRUTHS, ks=(1, 10), merge="union") == {1: 0.5, 10: 1.0}
    assert grounding_recall(scores, BOXES, TRUTHS, ks=(3,)) == {3: 1.0}  # the default: box by box
    # matched box by box, box 3 has IoU 1/2 with each of phrase 1's boxes: still a hit
    assert grounding_recall(scores, BOXES, TRUTHS, ks=(3,), merge="any") == {3: 1.0}
    assert grounding_recall(scores, BOXES, TRUTHS, ks=(3,), merge="any", iou_threshold=0.6) == {3: 0.5}


def test_phrase_scores_sum_glimpses_at_positions():
    attention = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    scores = phrase_scores(attention, [0, 3])
    assert scores.shape == (2, 3)
    assert scores[1, 2].item() == attention[0, 2, 3].item() + attention[1, 2, 3].item()
    with pytest.raises(ValueError, match=r"positions \[4\]"):
        phrase_scores(attention, [4])


def test_recall_bad_input():
    with pytest.raises(ValueError, match="1 ground-truth entries for 2 phrases"):
        grounding_recall(torch.zeros(2, 4), BOXES, TRUTHS[:1])


def test_parse_sentence():
    words, phrases = parse_sentence(
        "[/EN#18/people A man] with [/EN#19/clothing/other pierced ears] is wearing [/EN#20/clothing glasses] ."
    )
    assert words == ["A", "man", "with", "pierced", "ears", "is", "wearing", "glasses", "."]
    assert [(p.text, p.first_word, p.entity_id, p.types) for p in phrases] == [
        ("A man", 0, 18, ("people",)),
        ("pierced ears", 3, 19, ("clothing", "other")),
        ("glasses", 7, 20, ("clothing",)),
    ]
    with pytest.raises(ValueError, match="malformed"):
        parse_sentence("[/EN#18 broken")


def test_parse_boxes(tmp_path):
    path = tmp_path / "1.xml"
    path.write_text(
        "<annotation><size><width>500</width><height>333</height><depth>3</depth></size>"
        "<object><name>18</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object>"
        "<object><name>18</name><name>21</name><bndbox><xmin>5</xmin><ymin>6</ymin><xmax>7</xmax><ymax>8</ymax></bndbox></object>"
        "<object><name>19</name><nobndbox>1</nobndbox></object></annotation>"
    )
    boxes, size = parse_boxes(path)
    assert size == (500, 333)
    assert boxes == {18: [(1, 2, 30, 40), (5, 6, 7, 8)], 21: [(5, 6, 7, 8)]}
    with pytest.raises(FileNotFoundError):
        parse_boxes(tmp_path / "2.xml")


def test_box_targets_any_union_and_the_threshold_by_hand():
    from polyfuse.metrics.grounding import box_targets

    # A (2, 1, 10, 11), area 80; B (20, 1, 30, 11), area 100; their union box U (2, 1, 30, 11), area 280
    truth = torch.tensor([[2.0, 1.0, 10.0, 11.0], [20.0, 1.0, 30.0, 11.0]])
    candidates = torch.tensor([
        [2.0, 1.0, 30.0, 11.0],   # U: IoU 1 with U; 80 / 280 with A, 100 / 280 with B
        [2.0, 1.0, 10.0, 11.0],   # A: IoU 1 with A; 80 / 280 with U
        [2.0, 1.0, 10.0, 21.0],   # IoU exactly 80 / 160 = 0.5 with A (counts); 80 / 360 with U
        [2.0, 1.0, 16.0, 11.0],   # IoU exactly 140 / 280 = 0.5 with U; 80 / 140 = 0.57 with A
        [0.0, 0.0, 0.0, 0.0],     # padding never matches
    ])
    assert box_targets(candidates, truth).tolist() == [False, True, True, True, False]
    assert box_targets(candidates, truth, merge="union").tolist() == [True, False, False, True, False]
    assert box_targets(candidates, truth[:1], iou_threshold=0.51).tolist() == [False, True, False, True, False]
    with pytest.raises(ValueError, match="without a ground-truth box"):
        box_targets(candidates, torch.zeros(0, 4))
    with pytest.raises(ValueError, match="merge must be"):
        box_targets(candidates, truth, merge="max")
    # grounding_recall applies the same rules: the union box first makes it a hit at 1, box A a miss
    scores = torch.tensor([[5.0, 1.0, 0.0, 0.0, -1.0]])
    assert grounding_recall(scores, candidates, [truth], ks=(1,), merge="union") == {1: 1.0}
    assert grounding_recall(scores, candidates, [truth], ks=(1, 2)) == {1: 0.0, 2: 1.0}


def test_recall_counts_by_hand_with_ties_and_k_beyond_the_phrases():
    from polyfuse.metrics.grounding import recall_counts

    # 2 captions x 3 phrase slots x 4 boxes; caption 1's last slot is padding
    scores = torch.tensor([
        [[4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]],
        [[0.0, 0.0, 0.0, 0.0], [9.0, 8.0, 7.0, 6.0], [0.0, 0.0, 0.0, 0.0]],
    ])
    correct = torch.zeros(2, 3, 4, dtype=torch.bool)
    correct[0, 0, 3] = True   # the 4th best box: a hit at K >= 4 only
    correct[0, 1, 1] = True   # tied with box 0 for the best score: the lower index ranks first, so a hit at 2
    correct[0, 2, 3] = True   # the same box as phrase (0, 0)'s, its best: a hit at 1
    correct[1, 0, 2] = True   # all tied: rank 3
    correct[1, 2, 0] = True   # a padded slot: never counted
    mask = torch.tensor([[True, True, True], [True, True, False]])
    hits, bound, count = recall_counts(scores, correct, mask, ks=(1, 2, 3, 5))
    # phrase (1, 1) has no correct box; K = 5 > 3 phrases still ranks all 4 boxes
    assert hits.tolist() == [1, 2, 3, 4]
    assert int(bound) == 4 and int(count) == 5  # phrases with a correct box (3 distinct boxes)
    single = grounding_recall(scores[0, :1], torch.zeros(4, 4) + torch.tensor([0.0, 0.0, 1.0, 1.0]),
                              [torch.tensor([[0.0, 0.0, 1.0, 1.0]])], ks=(1,))
    assert single == {1: 1.0}  # one phrase is enough
