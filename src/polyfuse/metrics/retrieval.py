"""Cross-modal retrieval: chunked similarity, ranks, recall@K, median and mean rank.

Shapes: ``Q`` queries, ``G`` gallery items (what is retrieved), ``d`` embedding size.

Every query has one or more correct gallery items (text-to-video: a caption's one
video; video-to-text: all the captions of a video, as in MAN section 3.3 and the
collaborative-experts evaluation). The rank of a query is the rank of its
best-placed correct item, 1-based.

Ties are broken **pessimistically**: a wrong item whose score equals the best
correct score is counted as ranked above it, so a model that gives every item the
same score gets rank G - (number of correct items) + 1, never a lucky rank 1.
"Equals" is within float32 rounding (:data:`TIE_TOLERANCE`): two identical captions
embedded in chunks of different sizes (or on different DDP processes) get scores a few
ulps apart, and an exact comparison would rank them by that noise, so that the metrics
would depend on the evaluation chunk size.

A non-finite score (NaN or Inf) is refused with a ValueError naming its query and
item and the count, never ranked: a NaN at the correct item would otherwise be rank 1.

The similarity matrix is never held whole: :func:`retrieval_ranks` walks the
queries in chunks of ``chunk_size`` rows, so its peak extra memory is
``chunk_size x G`` scores (4 bytes each in float32), linear in the chunk.

Text-video retrieval in both directions (``C`` captions, ``N`` videos):
:func:`text_video_retrieval` scores a whole split at once, from embeddings or from a
(C, N) score matrix; :class:`TextVideoRetrieval` is its torchmetrics ``Metric``, which
accumulates the same over batches (a validation epoch) and computes it once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

__all__ = [
    "RECALL_KS",
    "TIE_TOLERANCE",
    "RetrievalMetrics",
    "TextVideoRetrieval",
    "chance_recall",
    "chunked_similarity",
    "query_targets",
    "ranks_from_scores",
    "recall_sum",
    "retrieval_metrics",
    "retrieval_ranks",
    "text_video_retrieval",
]

RECALL_KS = (1, 5, 10)
#: Scores within this much (relative to max(1, |best correct score|)) of the best correct
#: score count as tied with it: float32 rounding of one score computed in two batch sizes
#: is a few 1e-7; a real difference between two items is far larger.
TIE_TOLERANCE = 1e-5


def _tie_floor(best: Tensor) -> Tensor:
    """The lowest score that ties with (or beats) ``best``."""
    return best - TIE_TOLERANCE * best.abs().clamp_min(1.0)


def _check_embeddings(queries: object, gallery: object) -> tuple[Tensor, Tensor]:
    for name, value in (("queries", queries), ("gallery", gallery)):
        if not isinstance(value, Tensor) or not value.is_floating_point() or value.dim() != 2:
            raise ValueError(f"{name} must be a (N, d) float tensor")
        if value.shape[0] == 0:
            raise ValueError(f"{name} is empty")
        _check_finite(value, where=name, row_name="row", column_name="column")
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(
            f"queries have size {queries.shape[1]} but gallery items have {gallery.shape[1]}"
        )
    return queries, gallery


def _check_finite(
    values: Tensor,
    *,
    where: str = "the scores",
    row_name: str = "query",
    column_name: str = "item",
    row_offset: int = 0,
    more_bad: int = 0,
) -> None:
    """Raise a ValueError naming the first non-finite (NaN or +-Inf) entry of a 2-d
    tensor (its row, counted from ``row_offset``, and column) and how many there are
    (``more_bad`` are counted elsewhere, e.g. in later chunks). A NaN score would
    otherwise rank silently: ``NaN >= x`` is False, so a NaN at the correct item
    counts no wrong item above it and becomes rank 1."""
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):
        return
    row, column = (int(i) for i in bad.nonzero()[0])  # first in row-major order
    count = int(bad.sum()) + more_bad
    raise ValueError(
        f"{count} non-finite value{'s' if count != 1 else ''} (NaN or Inf) in {where}; the first is "
        f"{float(values[row, column])} at {row_name} {row + row_offset}, {column_name} {column}"
    )


def chunked_similarity(queries: Tensor, gallery: Tensor, *, chunk_size: int = 1024,
                       similarity: Callable[[Tensor, Tensor], Tensor] | None = None):
    """Yield ``(start, scores)`` blocks of the (Q, G) inner-product matrix.

    Args:
        queries: (Q, d); gallery: (G, d) (normalise both first for cosine scores).
        chunk_size: query rows per block.
        similarity: another scorer of the pairs, ``similarity(queries_block, gallery)``
            -> (rows, G) (e.g. collaborative experts' renormalised mixture,
            :func:`polyfuse.nn.models.retrieval.renormalized_scores`); None: inner products.

    Yields:
        ``start`` (int) and ``scores`` (min(chunk_size, Q - start), G) = queries[start:...] @ gallery^T.
    """
    queries, gallery = _check_embeddings(queries, gallery)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    for start in range(0, queries.shape[0], chunk_size):
        block = queries[start : start + chunk_size]
        yield start, block @ gallery.T if similarity is None else similarity(block, gallery)


def query_targets(query_ids: Sequence[str], gallery_ids: Sequence[str]) -> Tensor:
    """(Q, G) bool matrix, True where gallery item g has the id query q refers to.

    Text-to-video: ``query_ids`` are the video ids of the captions, ``gallery_ids``
    the video ids. Video-to-text: ``query_ids`` the video ids, ``gallery_ids`` the
    video id of each caption. Raises, naming the id, if a query has no correct item
    or an id is empty.
    """
    position: dict[str, list[int]] = {}
    for g, item in enumerate(gallery_ids):
        if not item:
            raise ValueError(f"gallery item {g} has an empty id")
        position.setdefault(item, []).append(g)
    targets = torch.zeros(len(query_ids), len(gallery_ids), dtype=torch.bool)
    for q, item in enumerate(query_ids):
        if item not in position:
            raise ValueError(f"query {q} refers to id {item!r}, which is not in the gallery")
        targets[q, position[item]] = True
    return targets


def retrieval_ranks(
    queries: Tensor, gallery: Tensor, targets: Tensor, *, chunk_size: int = 1024,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> Tensor:
    """1-based rank of each query's best correct item, ties broken pessimistically.

    rank_q = 1 + #{wrong g : s(q, g) >= max_{correct c} s(q, c)}  (>= within TIE_TOLERANCE)

    Args:
        queries: (Q, d); gallery: (G, d).
        targets: (Q, G) bool, True at the correct items (at least one per row), or (Q,)
            int64, the index of the one correct item of each query (no (Q, G) matrix:
            use it at scale).
        chunk_size: query rows scored at once (memory: chunk_size x G scores).
        similarity: the scorer of :func:`chunked_similarity` (None: inner products).

    Returns:
        (Q,) int64 ranks in [1, G].
    """
    queries, gallery = _check_embeddings(queries, gallery)
    if not isinstance(targets, Tensor) or targets.dtype not in (torch.bool, torch.long):
        raise ValueError("targets must be a (Q, G) bool tensor or a (Q,) int64 tensor of indices")
    if targets.dtype == torch.long:
        if targets.shape != (queries.shape[0],):
            raise ValueError(f"targets has shape {tuple(targets.shape)}, expected ({queries.shape[0]},)")
        if bool(((targets < 0) | (targets >= gallery.shape[0])).any()):
            raise ValueError(f"target indices must lie in [0, {gallery.shape[0]})")
    elif targets.shape != (queries.shape[0], gallery.shape[0]):
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, expected ({queries.shape[0]}, {gallery.shape[0]})"
        )
    else:
        missing = (~targets.any(dim=1)).nonzero().flatten()
        if missing.numel():
            raise ValueError(f"queries {missing[:10].tolist()} have no correct gallery item")
    ranks = torch.empty(queries.shape[0], dtype=torch.long)
    blocks = chunked_similarity(queries, gallery, chunk_size=chunk_size, similarity=similarity)
    for start, scores in blocks:
        if not bool(torch.isfinite(scores).all()):  # finite embeddings can still overflow
            later = sum(int((~torch.isfinite(block)).sum()) for _, block in blocks)
            _check_finite(scores, row_offset=start, more_bad=later)
        ranks[start : start + scores.shape[0]] = ranks_from_scores(scores, targets[start : start + scores.shape[0]])
    return ranks


def ranks_from_scores(scores: Tensor, targets: Tensor) -> Tensor:
    """Ranks (Q,) from a (Q, G) block of scores (any scorer, e.g. a cross-encoder) and
    its (Q, G) bool targets, or (Q,) int64 indices of the one correct item per query;
    pessimistic ties as in :func:`retrieval_ranks`. Raises a ValueError naming the
    query (row) and item (column) of the first non-finite score and their count."""
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() != 2:
        raise ValueError("scores must be a (Q, G) float tensor")
    _check_finite(scores)
    if targets.dtype == torch.long:  # one correct item: no (Q, G) target matrix
        best = scores.gather(1, targets.to(scores.device).view(-1, 1))
        return (scores >= _tie_floor(best)).sum(dim=1).cpu()  # the item itself + the wrong items tied or above
    if scores.shape != targets.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and targets {tuple(targets.shape)} differ")
    correct = targets.to(scores.device)
    if not bool(correct.any(dim=1).all()):
        raise ValueError("every query needs at least one correct gallery item")
    best = scores.masked_fill(~correct, float("-inf")).amax(dim=1, keepdim=True)
    return 1 + ((scores >= _tie_floor(best)) & ~correct).sum(dim=1).cpu()


@dataclass(frozen=True)
class RetrievalMetrics:
    """Recall@K in percent, median and mean rank (1-based), number of queries and of
    gallery items, for one direction."""

    recall: dict[int, float]
    median_rank: float
    mean_rank: float
    num_queries: int
    num_gallery: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        out = {f"{prefix}R@{k}": value for k, value in self.recall.items()}
        out[f"{prefix}MedR"] = self.median_rank
        out[f"{prefix}MeanR"] = self.mean_rank
        return out


def retrieval_metrics(ranks: Tensor, num_gallery: int, ks: Sequence[int] = RECALL_KS) -> RetrievalMetrics:
    """Recall@K (% of queries with rank <= K), median rank and mean rank.

    The median of an even number of ranks is the mean of the two middle ranks (numpy's
    convention, as in the collaborative-experts code), not torch's lower median.
    """
    if not isinstance(ranks, Tensor) or ranks.dim() != 1 or ranks.numel() == 0:
        raise ValueError("ranks must be a non-empty 1-d tensor")
    ranks_f = ranks.to(torch.float64)
    ordered = ranks_f.sort().values
    n = ordered.numel()
    median = float(ordered[n // 2]) if n % 2 else float((ordered[n // 2 - 1] + ordered[n // 2]) / 2)
    return RetrievalMetrics(
        recall={int(k): float((ranks_f <= k).double().mean() * 100) for k in ks},
        median_rank=median,
        mean_rank=float(ranks_f.mean()),
        num_queries=n,
        num_gallery=int(num_gallery),
    )


def chance_recall(targets: Tensor, ks: Sequence[int] = RECALL_KS) -> dict[int, float]:
    """Expected recall@K in percent of a random ranking (uniform permutation).

    For a query with c correct items among G, P(best correct rank <= K) =
    1 - C(G - c, K) / C(G, K).
    """
    gallery = targets.shape[1]
    counts = targets.sum(dim=1).tolist()
    out = {}
    for k in ks:
        total = 0.0
        for c in counts:
            miss = 1.0
            for i in range(min(k, gallery)):  # prod_{i<K} (G - c - i) / (G - i)
                miss *= max(gallery - c - i, 0) / (gallery - i)
            total += 1.0 - miss
        out[int(k)] = 100.0 * total / len(counts)
    return out


def _video_targets(caption_video: Tensor, num_videos: int) -> Tensor:
    """(N, C) bool: True where caption c describes video n. Raises, naming them, when
    videos have no caption (a video-to-text query needs one)."""
    targets = torch.zeros(num_videos, caption_video.numel(), dtype=torch.bool)
    targets[caption_video, torch.arange(caption_video.numel())] = True
    missing = (~targets.any(dim=1)).nonzero().flatten()
    if missing.numel():
        raise ValueError(f"text-video retrieval: videos {missing[:10].tolist()} have no caption ({missing.numel()} such videos)")
    return targets


def text_video_retrieval(
    caption_video: Tensor,
    *,
    texts: Tensor | None = None,
    videos: Tensor | None = None,
    scores: Tensor | None = None,
    ks: Sequence[int] = RECALL_KS,
    chunk_size: int = 1024,
    chance: bool = True,
    similarity: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> dict[str, float]:
    """Recall@K, MedR and MeanR of text-to-video (``t2v_``) and video-to-text (``v2t_``)
    retrieval over one split, and (``chance``) the recall of a random ranking
    (``chance_t2v_R@K``, ``chance_v2t_R@K``): the keys of the retrieval runs.

    Text to video: each caption queries the N videos, one correct. Video to text: each
    video queries the C captions, all of its captions correct (its rank is its
    best-placed caption's). Ranks as :func:`retrieval_ranks` (pessimistic ties).

    Args:
        caption_video: (C,) long, the video (row of ``videos``, column of ``scores``) of
            each caption.
        texts: (C, d) caption embeddings and videos: (N, d) video embeddings, scored by
            inner product (normalise them first for cosine scores); or
        scores: (C, N) the score of every caption-video pair (any scorer).
        similarity: with texts and videos, ``similarity(texts, videos)`` -> (C', N') scores
            of any rows of them, in place of inner products (video-to-text ranks its transpose).
    """
    if (scores is None) == (texts is None and videos is None):
        raise ValueError("text-video retrieval: give texts and videos, or scores, not both")
    if scores is None and (texts is None or videos is None):
        raise ValueError("text-video retrieval: texts and videos go together")
    num_captions, num_videos = (texts.shape[0], videos.shape[0]) if scores is None else tuple(scores.shape[:2])
    if (not isinstance(caption_video, Tensor) or caption_video.dtype != torch.long
            or caption_video.shape != (num_captions,)):
        raise ValueError(f"text-video retrieval: caption_video must be a ({num_captions},) int64 tensor of video rows")
    if num_captions and bool(((caption_video < 0) | (caption_video >= num_videos)).any()):
        raise ValueError(f"text-video retrieval: caption_video must lie in [0, {num_videos})")
    caption_video = caption_video.cpu()
    video_targets = _video_targets(caption_video, num_videos)  # (N, C)
    if scores is None:
        backward = None if similarity is None else partial(_transposed, similarity)
        t2v = retrieval_ranks(texts, videos, caption_video, chunk_size=chunk_size, similarity=similarity)
        v2t = retrieval_ranks(videos, texts, video_targets, chunk_size=chunk_size, similarity=backward)
    else:
        t2v = ranks_from_scores(scores, caption_video)
        v2t = ranks_from_scores(scores.T, video_targets)
    out: dict[str, float] = {}
    for name, ranks, targets, gallery in (
        ("t2v_", t2v, video_targets.T, num_videos),
        ("v2t_", v2t, video_targets, num_captions),
    ):
        out.update(retrieval_metrics(ranks, gallery, ks).as_dict(name))
        if chance:
            out.update({f"chance_{name}R@{k}": v for k, v in chance_recall(targets, ks).items()})
    return out


def _transposed(similarity: Callable[[Tensor, Tensor], Tensor], videos: Tensor, texts: Tensor) -> Tensor:
    return similarity(texts, videos).T


def _first_of_each_row(rows: Tensor) -> Tensor:
    """Positions of the first occurrence of each distinct value of ``rows`` (M,), in the
    order of the values."""
    order = torch.argsort(rows, stable=True)
    ordered = rows[order]
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return order[first]


def _gathered(state: list[Tensor] | Tensor) -> Tensor | None:
    """A state's rows, or None when no update gave any (after a DDP sync a state that no
    process filled is an empty tensor, not an empty list)."""
    if isinstance(state, list) and not state:
        return None
    rows = dim_zero_cat(state)
    return None if rows.numel() == 0 else rows


class TextVideoRetrieval(Metric):
    """:func:`text_video_retrieval` over a split that arrives in batches.

    ``update(caption_rows=, caption_video=, texts=, videos=, video_rows=)`` or
    ``update(caption_rows=, caption_video=, scores=)``, with any of the parts in any
    call (a batch of captions, a batch of videos, or pairs of both):

    * ``caption_rows`` (B,) long: each caption's row in the split, its id;
      ``caption_video`` (B,) long: the row of its video;
    * ``texts`` (B, d): their embeddings, and ``videos`` (B_v, d) with ``video_rows``
      (B_v,) long: video embeddings and their rows; or
    * ``scores`` (B, N): each caption's score against every video of the split (column
      n: video row n).

    A row given twice counts once, its first copy (a loader of caption-video pairs
    repeats each video; DDP's sampler pads with repeats), so the result is that of the
    whole split whatever the batches and the number of processes. States are tensors
    concatenated across processes under DDP (``dist_reduce_fx="cat"``): each process may
    add its share of the split, and ``compute()`` ranks the whole split on every process,
    alike. ``sync_on_compute=False`` keeps a process's own states (an evaluation that only
    one of the processes runs). ``similarity``: the scorer of texts against videos of
    :func:`text_video_retrieval` (None: inner products). ``compute()`` returns the keys of
    :func:`text_video_retrieval` as floats.
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, *, ks: Sequence[int] = RECALL_KS, chunk_size: int = 1024, chance: bool = True,
                 sync_on_compute: bool = True, similarity: Callable[[Tensor, Tensor], Tensor] | None = None) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        self.ks, self.chunk_size, self.chance = tuple(int(k) for k in ks), int(chunk_size), bool(chance)
        self.similarity = similarity
        for name in ("caption_rows", "caption_video", "texts", "scores", "videos", "video_rows"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(
        self,
        *,
        caption_rows: Tensor | None = None,
        caption_video: Tensor | None = None,
        texts: Tensor | None = None,
        scores: Tensor | None = None,
        videos: Tensor | None = None,
        video_rows: Tensor | None = None,
    ) -> None:
        if texts is not None and scores is not None:
            raise ValueError("TextVideoRetrieval.update: give texts or scores, not both")
        captions = texts if texts is not None else scores
        if (captions is None) != (caption_rows is None) or (caption_rows is None) != (caption_video is None):
            raise ValueError(
                "TextVideoRetrieval.update: caption_rows, caption_video and texts (or scores) go together"
            )
        if (videos is None) != (video_rows is None):
            raise ValueError("TextVideoRetrieval.update: videos and video_rows go together")
        for name, rows, values in (("caption", caption_rows, captions), ("video", video_rows, videos)):
            if rows is None:
                continue
            if rows.dtype != torch.long or rows.dim() != 1 or values.dim() != 2 or values.shape[0] != rows.shape[0]:
                raise ValueError(
                    f"TextVideoRetrieval.update: {name}_rows {tuple(rows.shape)} must be (B,) int64 "
                    f"beside (B, ...) values, got {tuple(values.shape)}"
                )
        if caption_rows is not None:
            if caption_video.shape != caption_rows.shape or caption_video.dtype != torch.long:
                raise ValueError(
                    f"TextVideoRetrieval.update: caption_video {tuple(caption_video.shape)} must be "
                    f"{tuple(caption_rows.shape)} int64"
                )
            self.caption_rows.append(caption_rows)
            self.caption_video.append(caption_video)
            (self.texts if texts is not None else self.scores).append(captions.detach())
        if video_rows is not None:
            self.video_rows.append(video_rows)
            self.videos.append(videos.detach())

    def compute(self) -> dict[str, float]:
        caption_rows, caption_video = _gathered(self.caption_rows), _gathered(self.caption_video)
        texts, scores = _gathered(self.texts), _gathered(self.scores)
        videos, video_rows = _gathered(self.videos), _gathered(self.video_rows)
        if caption_rows is None:
            raise ValueError("TextVideoRetrieval.compute: no caption was added")
        if texts is not None and scores is not None:
            raise ValueError("TextVideoRetrieval.compute: some updates gave texts, others scores; give one kind")
        keep = _first_of_each_row(caption_rows)
        caption_video = caption_video[keep].cpu()
        options = {"ks": self.ks, "chunk_size": self.chunk_size, "chance": self.chance}
        if scores is not None:
            return text_video_retrieval(caption_video, scores=scores[keep], **options)
        if videos is None:
            raise ValueError("TextVideoRetrieval.compute: captions were added as texts but no video was")
        video_keep = _first_of_each_row(video_rows)
        video_rows = video_rows[video_keep].cpu()  # ascending
        position = torch.searchsorted(video_rows, caption_video).clamp_max(video_rows.numel() - 1)
        unknown = (video_rows[position] != caption_video).nonzero().flatten()
        if unknown.numel():
            first = int(unknown[0])
            raise ValueError(
                f"TextVideoRetrieval.compute: caption row {int(caption_rows[keep][first])} belongs to video row "
                f"{int(caption_video[first])}, which no update gave ({unknown.numel()} such captions)"
            )
        return text_video_retrieval(position, texts=texts[keep], videos=videos[video_keep], similarity=self.similarity,
                                    **options)


def recall_sum(metrics: dict[str, float]) -> float:
    """``rsum``: the sum of the six recalls (R@1, 5, 10 of both directions) of
    :func:`text_video_retrieval`'s metrics, the chance recalls left out."""
    return sum(v for k, v in metrics.items() if "R@" in k and not k.startswith("chance"))
