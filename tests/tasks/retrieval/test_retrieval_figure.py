"""The ranking figure (`polyfuse plot ranking`): the ranking of one query against scores
computed video by video, stable ties, and thumbnails that show each ranked clip's own frame."""

import numpy as np
import pytest
import torch

from polyfuse.data.formats.experts import RetrievalCorpus, load_expert
from polyfuse.nn.models.retrieval import RetrievalModel
from polyfuse.tasks.ranking.figure import RankedVideo, draw_ranking, rank_by_scores
from polyfuse.tasks.retrieval.figure import video_scores

IDS = ["a", "b", "c", "d"]


def corpus(tmp_path):
    rng = np.random.default_rng(0)
    experts = {}
    for name, dim in (("x", 4), ("y", 3)):
        features = rng.normal(size=(4, 2, dim)).astype(np.float32)
        features[3] = features[0]  # video d equals video a in every expert: a tie
        np.savez(tmp_path / f"{name}.npz", video_ids=np.array(IDS), features=features)
        experts[name] = load_expert(tmp_path / f"{name}.npz")
    return RetrievalCorpus.build(experts, {v: [f"caption of {v}"] for v in IDS}, IDS)


def test_ranking_matches_scores_computed_video_by_video(tmp_path):
    part = corpus(tmp_path)
    torch.manual_seed(0)
    model = RetrievalModel(6, [4, 3], embed_dim=5, fusion="mean").eval()
    query = torch.randn(1, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        text = torch.nn.functional.normalize(model.text_head(query[0]), dim=0)
        scores = {}
        for i, video in enumerate(IDS):
            features = [part.experts[n].features[i : i + 1] for n in ("x", "y")]
            masks = [part.experts[n].mask[i : i + 1] for n in ("x", "y")]
            present = torch.stack([part.experts[n].present[i : i + 1] for n in ("x", "y")], dim=1)
            scores[video] = float(text @ model.embed_videos(features, masks, present)[0])
    expected = sorted(IDS, key=lambda v: (-round(scores[v], 5), IDS.index(v)))  # ties: corpus order
    scored = video_scores(model, part, query)
    ranking = rank_by_scores(scored, part.video_ids, correct_id="b")[:3]
    assert [r.video_id for r in ranking] == expected[:3]
    assert [r.rank for r in ranking] == [1, 2, 3]
    for ranked in ranking:
        assert ranked.score == pytest.approx(scores[ranked.video_id], abs=1e-5)
        assert ranked.correct == (ranked.video_id == "b")
    assert IDS.index("a") < IDS.index("d") and scores["a"] == pytest.approx(scores["d"])
    full = [r.video_id for r in rank_by_scores(scored, part.video_ids)]
    assert len(full) == 4 and full.index("a") < full.index("d")  # the tie keeps the corpus order
    assert all(r.correct is None for r in rank_by_scores(scored, part.video_ids))
    with pytest.raises(ValueError, match=r"\(4,\) scores for 3 videos"):
        rank_by_scores(scored, part.video_ids[:3])


def test_thumbnails_show_each_ranked_clip(tmp_path):
    av = pytest.importorskip("av")
    import matplotlib.image

    colours = {"a": (255, 0, 0), "b": (0, 0, 255)}
    clips = {}
    for video, colour in colours.items():
        path = tmp_path / f"{video}.avi"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("ffv1", rate=5)
            stream.width, stream.height, stream.pix_fmt = 32, 32, "bgr0"
            for _ in range(3):
                image = np.broadcast_to(np.array(colour, dtype=np.uint8), (32, 32, 3)).copy()
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
            container.mux(stream.encode())
        clips[video] = path
    ranking = [RankedVideo(1, "b", 0.9, None), RankedVideo(2, "a", 0.5, None)]  # no coloured frames
    out = draw_ranking(ranking, clips, "a query", tmp_path / "fig" / "top.png")
    image = matplotlib.image.imread(out)[..., :3]
    width = image.shape[1]
    left, right = image[:, : width // 2].reshape(-1, 3), image[:, width // 2 :].reshape(-1, 3)
    blue, red = np.array([0.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0])
    # rank 1 (video b, blue) on the left half, rank 2 (video a, red) on the right
    assert (np.abs(left - blue).max(axis=1) < 0.05).mean() > 0.05
    assert (np.abs(right - red).max(axis=1) < 0.05).mean() > 0.05
    assert (np.abs(left - red).max(axis=1) < 0.05).sum() == 0
    with pytest.raises(FileNotFoundError, match=r"no clip for video\(s\) \['c'\]"):
        draw_ranking([RankedVideo(1, "c", 0.1, None)], clips, "q", tmp_path / "x.png")
