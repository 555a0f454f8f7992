"""Per-epoch diagnostics of the two-branch retrieval fusions (``mean+man``) on MSVD.

Trains through :func:`polyfuse.engine.retrieval.train_retrieval` (the CLI's path) and,
at every validation, also records what each branch ranks alone (the mean-of-experts
half and the MAN half of the concatenated embeddings), the scale of the MAN branch's
score against the mean branch's (std over the validation caption-video pairs), and,
for diagnosis only, the test t2v R@1 of that epoch (the kept epoch is still chosen on
the validation recall sum). Writes one JSON per fusion and seed; ``--table FILES``
prints the test metrics of the kept epochs (mean ± sample std over the files of each
fusion and options) and the kept epochs' validation recall sums.

    PYTHONPATH=src python scripts/retrieval_branch_diagnostics.py --data ../shared/data/msvd \\
        --fusions mean mean+man --seeds 0 1 2 --out runs/branch_diag
    PYTHONPATH=src python scripts/retrieval_branch_diagnostics.py --table runs/branch_diag/*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import polyfuse.engine.retrieval as engine
from polyfuse.engine.retrieval_runs import load_corpus, text_encoder
from polyfuse.metrics.retrieval import query_targets, retrieval_metrics, retrieval_ranks


def _rsum(texts, videos, part) -> dict[str, float]:
    out = {}
    for name, q, g, q_ids, g_ids in (("t2v_", texts, videos, part.caption_video, part.video_ids),
                                     ("v2t_", videos, texts, part.video_ids, part.caption_video)):
        ranks = retrieval_ranks(q, g, query_targets(q_ids, g_ids))
        out.update(retrieval_metrics(ranks, len(g_ids)).as_dict(name))
    out["rsum"] = sum(v for k, v in out.items() if "R@" in k)
    return out


def branch_report(model, part, text_vectors, embed_dim: int) -> dict:
    texts, videos = engine.embed_corpus(model, part, text_vectors)
    report = {"all": _rsum(texts, videos, part)}
    if texts.shape[1] == 2 * embed_dim:  # mean+man: [mean branch, MAN branch]
        halves = {"mean_branch": slice(0, embed_dim), "man_branch": slice(embed_dim, 2 * embed_dim)}
        for name, cut in halves.items():
            report[name] = _rsum(texts[:, cut], videos[:, cut], part)
            report[name + "_score_std"] = float((texts[:, cut] @ videos[:, cut].T).std())
        report["man_video_norm"] = float(videos[:, halves["man_branch"]].norm(dim=1).mean())
        report["mean_video_norm"] = float(videos[:, halves["mean_branch"]].norm(dim=1).mean())
    return report


COLUMNS = ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR", "v2t_R@1", "v2t_R@5", "v2t_R@10", "v2t_MedR")


def table(paths: list[str]) -> str:
    """One row per (fusion, options): test metrics of the kept epoch, mean ± sample std over
    seeds, the per-seed t2v R@1 and the mean kept validation recall sum."""
    groups: dict[str, list[dict]] = {}
    for path in sorted(paths):
        run = json.loads(Path(path).read_text())
        groups.setdefault(" ".join([run["fusion"], *run["options"]]), []).append(run)
    lines = ["| model | seeds | " + " | ".join(COLUMNS) + " | t2v R@1 per seed | val rsum |",
             "|---|---|" + "---|" * (len(COLUMNS) + 2)]
    for name, runs in groups.items():
        runs.sort(key=lambda r: r["seed"])
        kept = [r["epochs"][r["best_epoch"]]["test"]["all"] for r in runs]
        cells = []
        for column in COLUMNS:
            values = [k[column] for k in kept]
            cells.append(f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1
                         else f"{values[0]:.1f}")
        seeds = ", ".join(str(r["seed"]) for r in runs)
        per_seed = ", ".join(f"{k['t2v_R@1']:.1f}" for k in kept)
        val = statistics.mean(r["history"][r["best_epoch"]]["val_rsum"] for r in runs)
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + f" | {per_seed} | {val:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these result files")
    parser.add_argument("--data")
    parser.add_argument("--fusions", nargs="+", default=["mean", "mean+man"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                        help="a RetrievalSettings field, e.g. man_layer_norm=false")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.data is None or args.out is None:
        parser.error("--data and --out are needed to train")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus, split = load_corpus(args.data)
    parts = {name: corpus.subset(split[name]) for name in ("train", "val", "test")}
    encoder = text_encoder("minilm", corpus)
    vectors = {n: engine.encode_captions(encoder, p.captions, cache_dir=out.parent / ".cache") for n, p in parts.items()}
    original = engine.evaluate_retrieval
    for fusion in args.fusions:
        for seed in args.seeds:
            settings = engine.RetrievalSettings(fusion=fusion, epochs=args.epochs)
            for option in args.option:
                key, _, value = option.partition("=")
                setattr(settings, key, json.loads(value))
            epochs: list[dict] = []

            def evaluate(model, part, text_vectors, *, chunk_size=1024, _epochs=epochs, _settings=settings):
                metrics = original(model, part, text_vectors, chunk_size=chunk_size)
                _epochs.append({"val": branch_report(model, part, text_vectors, _settings.embed_dim),
                                "test": branch_report(model, parts["test"], vectors["test"], _settings.embed_dim)})
                model.train()
                return metrics

            engine.evaluate_retrieval = evaluate
            start = time.perf_counter()
            try:
                _, history = engine.train_retrieval(parts["train"], vectors["train"], parts["val"],
                                                        vectors["val"], settings, seed)
            finally:
                engine.evaluate_retrieval = original
            seconds = time.perf_counter() - start
            best = max(range(len(history)), key=lambda i: (history[i]["val_rsum"], -i))
            line = {"fusion": fusion, "seed": seed, "options": args.option, "seconds": seconds, "best_epoch": best,
                    "history": history, "epochs": epochs}
            name = fusion.replace("+", "_") + "".join("_" + o.replace("=", "-") for o in args.option)
            (out / f"{name}_seed{seed}.json").write_text(json.dumps(line, indent=1))
            kept = epochs[best]
            print(f"{fusion} seed {seed}: best epoch {best}, val rsum {history[best]['val_rsum']:.1f}, "
                  f"test t2v R@1 {kept['test']['all']['t2v_R@1']:.1f} ({seconds:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
