"""Retrieval runs: load a corpus, encode its captions, train over seeds, write results.

Results of a run directory: ``results.json`` (settings, per-seed test metrics and
chance levels, training history, wall times) and ``seed<N>.safetensors`` (the model's
weights as safetensors tensors, and what is needed to rebuild it as JSON in the file's
metadata: :func:`~polyfuse.engine.checkpoints.write_checkpoint`). Nothing pickled is
written or read: an older pickled ``seed<N>.pt`` is refused with how to convert it.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from polyfuse.data.formats.experts import RetrievalCorpus, load_captions, load_expert, read_id_list
from polyfuse.data.sources import is_synthetic
from polyfuse.engine.checkpoints import check_finite_state, read_checkpoint, write_checkpoint
from polyfuse.engine.retrieval import (
    RetrievalSettings,
    encode_captions,
    evaluate_retrieval,
    fine_tuned_parameters,
    shuffle_words,
    train_retrieval,
)
from polyfuse.engine.rundir import atomic_write_text
from polyfuse.nn.models.retrieval import RetrievalModel

__all__ = ["load_corpus", "metrics_table", "read_retrieval_checkpoint", "run_retrieval", "text_encoder"]

CHECKPOINT_SUFFIX = ".safetensors"
#: the entries a checkpoint of `retrieval train` and of `retrieval chimera` must hold
_NEEDED = {"retrieval": ("state", "settings", "text_dim", "expert_dims"),
           "chimera": ("state", "row", "text_dim", "video_dim", "expert")}
_CONVERT = (
    "python -c \"import sys, torch; from polyfuse.engine.checkpoints import write_checkpoint; "
    "write_checkpoint(torch.load(sys.argv[1], weights_only=True), sys.argv[2])\" OLD.pt NEW.safetensors"
)

METRIC_COLUMNS = ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MedR", "v2t_R@1", "v2t_R@5", "v2t_R@10", "v2t_MedR")


def load_corpus(
    data: str | None = None,
    *,
    experts: list[str] | None = None,
    captions: str | None = None,
    split_ids: dict[str, str] | None = None,
) -> tuple[RetrievalCorpus, dict[str, list[str]]]:
    """The MSVD folder (``data``), a ``synthetic:videos=N,...`` spec (see
    :mod:`polyfuse.data.synthetic_retrieval`), or expert files ``NAME=PATH`` + captions JSON +
    id lists."""
    if data is not None and is_synthetic(data):
        from polyfuse.data.synthetic_retrieval import synthetic_retrieval_split

        return synthetic_retrieval_split(data)
    if data is not None:
        from polyfuse.data.formats.msvd_retrieval import load_msvd_retrieval

        return load_msvd_retrieval(data)
    if not experts or captions is None or not split_ids:
        raise ValueError("give --data (MSVD folder) or --expert NAME=PATH ... --captions FILE --train-ids ...")
    loaded = {}
    for spec in experts:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"--expert takes NAME=PATH, got {spec!r}")
        loaded[name] = load_expert(path, name)
    split = {name: read_id_list(path) for name, path in split_ids.items()}
    all_ids = [v for ids in split.values() for v in ids]
    return RetrievalCorpus.build(loaded, load_captions(captions), all_ids), split


def text_encoder(kind: str, corpus: RetrievalCorpus | None = None, *, trainable: bool = False):
    """``"minilm"``, ``"bow"`` (word counts over the sorted words of ``corpus``'s captions,
    for synthetic corpora) or a path to a GloVe-format vectors file; ``trainable``: built
    to be fine-tuned (MiniLM and word vectors)."""
    from polyfuse.nn.sentence_encoder import MiniLMEncoder, StaticWordEncoder

    if kind == "bow":
        from polyfuse.data.synthetic_retrieval import BagOfWordsEncoder

        if corpus is None:
            raise ValueError("--text bow needs the corpus, whose words make its vocabulary")
        return BagOfWordsEncoder(sorted({word for caption in corpus.captions for word in caption.split()}))
    return MiniLMEncoder(trainable=trainable) if kind == "minilm" else StaticWordEncoder.from_file(kind, trainable=trainable)


def saved_text_encoder(saved: dict, corpus: RetrievalCorpus | None = None):
    """The text encoder a checkpoint was trained with: ``saved["text"]`` (MiniLM when absent,
    as for Chimera's), with its fine-tuned weights when the checkpoint holds them."""
    encoder = text_encoder(saved.get("text", "minilm"), corpus)
    if "text_state" in saved:  # fine-tuned with the model
        encoder.load_state_dict(saved["text_state"])
    return encoder


def run_retrieval(
    corpus: RetrievalCorpus,
    split: dict[str, list[str]],
    settings: RetrievalSettings,
    seeds: list[int],
    out_dir: str | Path,
    *,
    text: str = "minilm",
    references: dict[str, float] | None = None,
) -> dict:
    """Train one model per seed on ``split["train"]``, select on ``val``, test on ``test``
    with the captions as written (EX1) and with their words shuffled (EX2).
    ``references``: reference recalls of the test split (e.g. the synthetic corpus's
    :func:`~polyfuse.data.synthetic_retrieval.recall_bounds`), kept in results.json and
    printed as rows of the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = {name: corpus.subset(split[name]) for name in ("train", "val", "test")}
    fine_tune = settings.text_lr is not None
    encoder = text_encoder(text, corpus, trainable=fine_tune)
    if fine_tune:
        fine_tuned_parameters(encoder)  # a clear error before any work when there is nothing to train
    initial_text = copy.deepcopy(encoder.state_dict()) if fine_tune else None
    start = time.perf_counter()
    vectors = {name: encode_captions(encoder, p.captions, cache_dir=out.parent / ".cache") for name, p in parts.items()}
    shuffled = encode_captions(encoder, shuffle_words(parts["test"].captions, 0), cache_dir=out.parent / ".cache")
    encode_seconds = time.perf_counter() - start
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        if fine_tune:  # every seed starts from the pre-trained encoder
            encoder.load_state_dict(initial_text)
        model, history = train_retrieval(parts["train"], vectors["train"], parts["val"], vectors["val"], settings,
                                         seed, encoder=encoder)
        train_seconds = time.perf_counter() - start
        if fine_tune:  # the test captions through the fine-tuned encoder (no cache: it has changed)
            vectors["test"] = encode_captions(encoder, parts["test"].captions)
            shuffled = encode_captions(encoder, shuffle_words(parts["test"].captions, 0))
        start = time.perf_counter()
        test = evaluate_retrieval(model, parts["test"], vectors["test"], chunk_size=settings.chunk_size)
        eval_seconds = time.perf_counter() - start
        test_shuffled = evaluate_retrieval(model, parts["test"], shuffled, chunk_size=settings.chunk_size)
        # the layout resolved (None -> the default of the fusion), so that a later default
        # cannot change how this checkpoint is read
        saved_settings = {**asdict(settings), "man_zero_init": model.video.man_zero_init}
        write_checkpoint(
            {"state": model.state_dict(), "settings": saved_settings, "text_dim": vectors["train"].shape[1],
             "expert_dims": [e.dim for e in corpus.experts.values()], "text": text,
             **({"text_state": encoder.state_dict()} if fine_tune else {})},
            out / f"seed{seed}{CHECKPOINT_SUFFIX}",
        )
        runs.append({"seed": seed, "test": test, "test_shuffled_words": test_shuffled, "history": history,
                     "train_seconds": train_seconds, "eval_seconds": eval_seconds})
        result = {"settings": asdict(settings), "text": text, "experts": list(corpus.experts),
                  **({"references": references} if references else {}),
                  "counts": {n: {"videos": len(p.video_ids), "captions": len(p.captions)} for n, p in parts.items()},
                  "encode_seconds": encode_seconds, "runs": runs}
        atomic_write_text(out / "results.json", json.dumps(result, indent=1))  # after every seed
    return result


def evaluate_chimera_checkpoint(saved: dict, part: RetrievalCorpus, captions: list[str]) -> dict[str, float]:
    """Test metrics of a Chimera model saved by :func:`run_chimera_ablation` on ``part``,
    its captions given as ``captions`` (as written, or shuffled)."""
    from polyfuse.engine.chimera_retrieval import ChimeraRow, encode_tokens, evaluate_chimera
    from polyfuse.nn.models.chimera import ChimeraRetrievalModel

    try:
        row = ChimeraRow(**saved["row"])
        model = ChimeraRetrievalModel(saved["text_dim"], saved["video_dim"], num_topics=row.num_topics,
                                      topic_variant=row.topic_variant, hyperbolic_dim=row.hyperbolic_dim)
        model.load_state_dict(saved["state"])
    except (TypeError, RuntimeError) as error:
        raise ValueError(f"the Chimera checkpoint does not rebuild its model: {error}") from None
    encoder = saved_text_encoder(saved)
    return evaluate_chimera(model, part, *encode_tokens(encoder, captions), expert=saved["expert"])


def read_retrieval_checkpoint(path: str | Path) -> dict:
    """The content of a ``seed<N>.safetensors`` of ``retrieval train`` or ``retrieval chimera``.

    Never unpickles anything: a pickled ``.pt`` of an older polyfuse is refused with how
    to re-train or convert it; a file lacking an entry, or with NaN / Inf weights, is
    refused naming it."""
    path = Path(path)
    if path.is_file() and path.suffix != CHECKPOINT_SUFFIX:
        raise ValueError(
            f"{path}: retrieval checkpoints are {CHECKPOINT_SUFFIX} files; pickled files (.pt, written by an "
            "older polyfuse) are never loaded, as unpickling can run code: re-train, or convert a "
            f"file you trust with: {_CONVERT}"
        )
    saved = read_checkpoint(path)
    kind = "chimera" if saved.get("kind") == "chimera" else "retrieval"
    missing = [key for key in _NEEDED[kind] if key not in saved]
    if missing:
        raise ValueError(f"{path}: not a {kind} checkpoint of polyfuse (it lacks {', '.join(missing)})")
    for entry in ("state", "text_state"):
        if entry in saved:
            if not isinstance(saved[entry], dict):
                raise ValueError(f"{path}: entry {entry!r} is a {type(saved[entry]).__name__}, not a state dict")
            check_finite_state(saved[entry], path)
    return saved


def load_checkpoint(path: str | Path) -> tuple[RetrievalModel, dict]:
    """The model of a ``retrieval train`` checkpoint and the checkpoint's content."""
    saved = read_retrieval_checkpoint(path)
    try:
        # without man_layer_norm (older): None, off for man; without man_zero_init (older):
        # mean+man's two unit vectors weighed equally, the only layout there was
        s = RetrievalSettings(**{"man_zero_init": False, **saved["settings"]})
        model = RetrievalModel(saved["text_dim"], saved["expert_dims"], embed_dim=s.embed_dim, fusion=s.fusion,
                               hidden_dim=s.hidden_dim, fusion_options=dict(s.fusion_options) or None,
                               man_layer_norm=s.man_layer_norm, man_zero_init=s.man_zero_init)
        model.load_state_dict(saved["state"])
    except (TypeError, RuntimeError) as error:
        raise ValueError(f"{path}: the checkpoint does not rebuild its model: {error}") from None
    return model, saved


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def metrics_table(results: dict[str, dict], key: str = "test") -> str:
    """Markdown table: one row per named result, mean ± std over seeds, chance row first."""
    header = "| model | " + " | ".join(METRIC_COLUMNS) + " | train s/seed |"
    lines = [header, "|" + "---|" * (len(METRIC_COLUMNS) + 2)]
    first_result = next(iter(results.values()))
    first = first_result["runs"][0][key]
    chance = [f"{first['chance_' + c]:.1f}" if "R@" in c else "-" for c in METRIC_COLUMNS]
    lines.append("| chance | " + " | ".join(chance) + " | - |")
    references = first_result.get("references", {})
    for prefix, label in (("caption_", "bound: perfect caption match"),
                          ("events_", "bound: events known, relation not")):
        if any(name.startswith(prefix) for name in references):
            cells = [f"{references[prefix + c[4:]]:.1f}" if c.startswith("t2v_R@") else "-" for c in METRIC_COLUMNS]
            lines.append(f"| {label} | " + " | ".join(cells) + " | - |")
    for name, result in results.items():
        cells = [_mean_std([r[key][c] for r in result["runs"]]) for c in METRIC_COLUMNS]
        seconds = statistics.mean(r["train_seconds"] for r in result["runs"])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    return "\n".join(lines)


def run_chimera_ablation(
    corpus: RetrievalCorpus,
    split: dict[str, list[str]],
    rows: list[str],
    seeds: list[int],
    out_dir: str | Path,
    *,
    epochs: int = 10,
    batch_size: int = 16,
    text_lr: float | None = None,
    expert: str | None = None,
    precision: str = "32-true",
    mask_rate: float = 0.2,
    patience: int | None = None,
    lr: float = 1e-3,
    scalar_lr: float | None = None,
    tlm_temperature: float = 1.0,
) -> dict:
    """Chimera on MiniLM token states + one video expert (``expert``, default the corpus's
    first: MSVD's ``vgg_appearance``), one entry per Table 4 row; test with captions as
    written (EX1) and with their words shuffled (EX2). With ``text_lr`` MiniLM is fine-tuned
    with each model (every row and seed starting from the pre-trained weights). Each model
    is saved as ``<out>/<row>/seed<N>.safetensors`` for ``polyfuse retrieval evaluate``.
    ``precision``, ``mask_rate`` (Table 4's 20% of words and regions), ``patience``, ``lr``,
    ``scalar_lr``, ``tlm_temperature``:
    of :func:`~polyfuse.engine.chimera_retrieval.train_chimera`. With masking, L_T's
    masked-LM head is trained once on the training captions (or read from
    ``<out parent>/.cache``, :func:`~polyfuse.engine.chimera_lm.lm_head_for`); its report
    is ``results["lm_head"]``."""
    from polyfuse.engine.chimera_retrieval import (
        ABLATION_ROWS,
        encode_tokens,
        evaluate_chimera,
        train_chimera,
    )
    from polyfuse.nn.sentence_encoder import MiniLMEncoder

    if not 0.0 <= mask_rate < 1.0:
        raise ValueError(f"mask_rate must lie in [0, 1), got {mask_rate}")
    unknown = [r for r in rows if r not in ABLATION_ROWS]
    if unknown:
        raise ValueError(f"unknown ablation row {unknown[0]!r}; available: {', '.join(ABLATION_ROWS)}")
    expert = expert or next(iter(corpus.experts))
    if expert not in corpus.experts:
        raise ValueError(f"unknown expert {expert!r}; the corpus has {', '.join(corpus.experts)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = {name: corpus.subset(split[name]) for name in ("train", "val", "test")}
    encoder = MiniLMEncoder(trainable=text_lr is not None)
    initial_text = copy.deepcopy(encoder.state_dict()) if text_lr is not None else None
    tokens = {name: encode_tokens(encoder, p.captions) for name, p in parts.items()}
    shuffled = encode_tokens(encoder, shuffle_words(parts["test"].captions, 0))
    lm_head, lm_report = None, None
    if mask_rate > 0 and any(ABLATION_ROWS[r].topic_lm and ABLATION_ROWS[r].num_topics > 0 for r in rows):
        from polyfuse.engine.chimera_lm import lm_head_for

        lm_head, lm_report = lm_head_for(encoder, parts["train"].captions, parts["val"].captions,
                                         out.parent / ".cache")
    results = {}
    for name in rows:
        runs = []
        for seed in seeds:
            start = time.perf_counter()
            if text_lr is not None:
                encoder.load_state_dict(initial_text)
            model, history = train_chimera(parts["train"], tokens["train"], parts["val"], tokens["val"],
                                           ABLATION_ROWS[name], seed, epochs=epochs, batch_size=batch_size,
                                           encoder=encoder, text_lr=text_lr, expert=expert,
                                           precision=precision, mask_rate=mask_rate, lm_head=lm_head,
                                           patience=patience, lr=lr, scalar_lr=scalar_lr,
                                           tlm_temperature=tlm_temperature)
            seconds = time.perf_counter() - start
            test_tokens, test_shuffled = tokens["test"], shuffled
            if text_lr is not None:  # through the fine-tuned encoder
                test_tokens = encode_tokens(encoder, parts["test"].captions)
                test_shuffled = encode_tokens(encoder, shuffle_words(parts["test"].captions, 0))
            runs.append({"seed": seed, "train_seconds": seconds, "history": history,
                         "test": evaluate_chimera(model, parts["test"], *test_tokens, expert=expert),
                         "test_shuffled_words": evaluate_chimera(model, parts["test"], *test_shuffled,
                                                                 expert=expert)})
            (out / name).mkdir(exist_ok=True)
            write_checkpoint({"kind": "chimera", "row": asdict(ABLATION_ROWS[name]), "state": model.state_dict(),
                              "text_dim": tokens["train"][0].shape[-1], "video_dim": corpus.experts[expert].dim,
                              "expert": expert,
                              **({"text_state": encoder.state_dict()} if text_lr is not None else {})},
                             out / name / f"seed{seed}{CHECKPOINT_SUFFIX}")
        results[name] = {"row": asdict(ABLATION_ROWS[name]), "text_lr": text_lr, "precision": precision,
                         "mask_rate": mask_rate, "patience": patience, "lr": lr, "scalar_lr": scalar_lr,
                         "tlm_temperature": tlm_temperature, "epochs": epochs, "runs": runs}
        written = {**results, "lm_head": lm_report} if lm_report is not None else results
        atomic_write_text(out / "results.json", json.dumps(written, indent=1))
    return results
