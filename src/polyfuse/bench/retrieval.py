"""Cost of ranking N queries against N items in chunks (recall@K path), up to N = 10,000.

Each configuration runs in a fresh Python process, which reports the wall time of
:func:`polyfuse.metrics.retrieval.retrieval_ranks` and its peak memory: the growth of
the process's maximum resident set size (``ru_maxrss``) during ranking, after the
embeddings exist. The block of scores alone takes ``chunk x N x 4`` bytes.

    python -m polyfuse.bench.retrieval --out docs/benchmarks/retrieval.json

Also timed: embedding and ranking 1,000 synthetic captions against 1,000 synthetic
videos through a :class:`polyfuse.nn.models.retrieval.RetrievalModel` (MAN over 2 experts).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "measure_ranking"]

SIZES = (1000, 2000, 5000, 10000)
CHUNKS = (256, 1024)


def measure_ranking(size: int, chunk: int, dim: int = 256) -> dict:
    """In this process: time and peak-memory growth of ranking ``size`` x ``size``."""
    import torch

    from polyfuse.metrics.retrieval import retrieval_metrics, retrieval_ranks

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    queries = torch.nn.functional.normalize(torch.randn(size, dim, generator=g), dim=-1)
    gallery = torch.nn.functional.normalize(queries + 0.5 * torch.randn(size, dim, generator=g), dim=-1)
    targets = torch.arange(size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    ranks = retrieval_ranks(queries, gallery, targets, chunk_size=chunk)
    retrieval_metrics(ranks, size)
    seconds = time.perf_counter() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    return {"size": size, "chunk": chunk, "dim": dim, "seconds": seconds, "peak_growth_mib": grown / 1024,
            "score_block_mib": chunk * size * 4 / 2**20, "full_matrix_mib": size * size * 4 / 2**20}


def measure_end_to_end(size: int = 1000) -> dict:
    """Embed ``size`` synthetic captions and videos with an untrained MAN model and rank both ways."""
    import torch

    from polyfuse.data.synthetic_retrieval import bag_of_words, make_synthetic_retrieval
    from polyfuse.nn.models.retrieval import RetrievalModel
    from polyfuse.tasks.retrieval.spec import rank_metrics

    torch.set_num_threads(1)
    corpus, vocabulary = make_synthetic_retrieval(size, steps=8, dim=32)
    text = bag_of_words(corpus.captions, vocabulary)
    model = RetrievalModel(text.shape[1], [32, 32], embed_dim=64, fusion="man", hidden_dim=32)
    experts = list(corpus.experts.values())
    start = time.perf_counter()
    with torch.no_grad():
        videos = model.embed_videos([e.features for e in experts], [e.mask for e in experts],
                                    torch.stack([e.present for e in experts], dim=1))
        rank_metrics(model.embed_texts(text), videos, corpus.caption_video, corpus.video_ids)
    return {"size": size, "seconds_embed_and_rank_both_directions": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--chunks", type=int, nargs="+", default=list(CHUNKS))
    parser.add_argument("--single", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single:
        print(json.dumps(measure_ranking(*args.single)))
        return 0
    rows = []
    for size in args.sizes:
        for chunk in args.chunks:
            done = subprocess.run(
                [sys.executable, "-m", "polyfuse.bench.retrieval", "--out", "-", "--single", str(size), str(chunk)],
                check=True, capture_output=True, text=True,
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1])
    result = {"ranking": rows, "end_to_end": measure_end_to_end()}
    print(result["end_to_end"])
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
