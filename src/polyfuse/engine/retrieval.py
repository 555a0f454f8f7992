"""Training and evaluation of text-video retrieval over expert features (MAN section 3.3).

A training step draws ``batch_size`` distinct videos and one of each video's captions
(uniformly), scores every caption against every video of the batch and applies the
bidirectional max-margin loss with hardest negatives (or InfoNCE). Evaluation embeds
every caption and every video of a split and ranks the whole split in chunks
(:func:`polyfuse.metrics.retrieval.retrieval_ranks`): text-to-video with each caption
a query, video-to-text with each video a query and all its captions correct.
The epoch with the best validation sum of recalls (both directions) is kept.

``precision="bf16-mixed"`` runs each training step's forward and loss under CPU
bfloat16 autocast (these loops run on the CPU; the backward follows the forward's
dtypes, the weights and the optimizer stay float32); validation and test run in float32.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.engine.rundir import atomic_temp_path, write_bytes
from polyfuse.engine.seeding import seed_everything
from polyfuse.functional.contrastive import info_nce_loss, max_margin_ranking_loss
from polyfuse.metrics.retrieval import (
    chance_recall,
    query_targets,
    retrieval_metrics,
    retrieval_ranks,
)
from polyfuse.nn.models.retrieval import RetrievalModel

__all__ = [
    "LOOP_PRECISIONS",
    "RetrievalSettings",
    "encode_captions",
    "encoder_fingerprint",
    "evaluate_retrieval",
    "own_group",
    "parameter_groups",
    "shuffle_words",
    "split_man_branch",
    "train_retrieval",
    "training_autocast",
]


#: The precisions of the retrieval loops: float32, or bfloat16 autocast on the CPU.
LOOP_PRECISIONS = ("32-true", "bf16-mixed")


def training_autocast(precision: str) -> contextlib.AbstractContextManager:
    """The context of a training step's forward and loss: none for ``"32-true"``, CPU
    bfloat16 autocast for ``"bf16-mixed"``; another value is a ValueError."""
    if precision == "32-true":
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(LOOP_PRECISIONS)}")


@dataclass
class RetrievalSettings:
    fusion: str = "man"
    embed_dim: int = 256
    hidden_dim: int = 64
    epochs: int = 30
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 1e-4
    loss: str = "margin"  # "margin" (max-margin, hardest negatives) or "infonce"
    margin: float = 0.2
    temperature: float = 0.05
    chunk_size: int = 1024
    fusion_options: dict = field(default_factory=dict)
    text_lr: float | None = None  # None: the text encoder is frozen; else fine-tuned at this rate
    precision: str = "32-true"  # or "bf16-mixed": training steps under CPU bfloat16 autocast
    man_layer_norm: bool | None = None  # LayerNorm on MAN's fused vector; None: on for gating+man, mean+man
    man_zero_init: bool | None = None  # mean+man: MAN's branch starts at zero; None: on for mean+man
    man_lr: float | None = None  # learning rate of MAN's video branch in gating+man / mean+man; None: lr


def shuffle_words(captions: Sequence[str], seed: int) -> list[str]:
    """Each caption with its whitespace-separated words in a random order (Chimera EX2)."""
    rng = random.Random(seed)
    out = []
    for caption in captions:
        words = caption.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return out


def encoder_fingerprint(encoder) -> str:
    """A hash of everything an encoder's output depends on: its class, its vocabulary
    (``index`` or ``vocabulary``), ``max_length`` and every tensor of its state (names,
    dtypes, shapes and bytes). Two word-vector files give two fingerprints."""
    digest = hashlib.sha256(f"{type(encoder).__module__}.{type(encoder).__qualname__}".encode())
    for attribute in ("index", "vocabulary", "max_length"):
        if hasattr(encoder, attribute):
            digest.update(f"{attribute}={json.dumps(getattr(encoder, attribute))}".encode())
    state = encoder.state_dict() if hasattr(encoder, "state_dict") else {}
    for name, tensor in state.items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def content_cache_path(cache_dir: str | Path | None, prefix: str, key_parts: object) -> Path | None:
    """``<cache_dir>/<prefix>_<hash>.safetensors``, the hash over ``key_parts`` (JSON):
    a file named by the content of what it caches; None without a cache folder."""
    if cache_dir is None:
        return None
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:32]
    return Path(cache_dir) / f"{prefix}_{key}.safetensors"


def _read_cache(cache: Path, count: int) -> Tensor | None:
    """The vectors of a cache file, or None (with a warning) when it is broken or foreign:
    a half-written cache is rebuilt, never trusted."""
    try:
        with safe_open(str(cache), framework="pt") as handle:
            vectors = handle.get_tensor("vectors")
    except (SafetensorError, OSError) as error:
        warnings.warn(f"{cache}: a broken caption cache ({error}); rebuilding it", stacklevel=3)
        return None
    if vectors.ndim != 2 or vectors.shape[0] != count or not bool(vectors.isfinite().all()):
        warnings.warn(f"{cache}: the caption cache does not hold {count} finite vectors; rebuilding it",
                      stacklevel=3)
        return None
    return vectors


def encode_captions(encoder, captions: Sequence[str], *, batch_size: int = 128, cache_dir: Path | None = None) -> Tensor:
    """(C, d_t) sentence vectors of a frozen encoder, cached by content.

    The cache file is named by a hash of the captions and of the encoder
    (:func:`encoder_fingerprint`: a run with another word-vector file never reads
    this one's vectors), written atomically (a temporary file renamed), and a cache
    that cannot be read (truncated, empty) is rebuilt."""
    cache = content_cache_path(cache_dir, "text", [list(captions), encoder_fingerprint(encoder)])
    if cache is not None and cache.is_file():
        vectors = _read_cache(cache, len(captions))
        if vectors is not None:
            return vectors
    parts = []
    with torch.no_grad():
        for start in range(0, len(captions), batch_size):
            parts.append(encoder(list(captions[start : start + batch_size])).sentence)
    vectors = torch.cat(parts)
    if cache is not None:
        with atomic_temp_path(cache) as partial:
            write_bytes(partial, save({"vectors": vectors.contiguous()}))
    return vectors


def _video_batch(corpus: RetrievalCorpus, rows: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
    experts = list(corpus.experts.values())
    return (
        [e.features[rows] for e in experts],
        [e.mask[rows] for e in experts],
        torch.stack([e.present[rows] for e in experts], dim=1),
    )


@torch.no_grad()
def embed_corpus(model: RetrievalModel, corpus: RetrievalCorpus, text_vectors: Tensor, batch_size: int = 64):
    """(C, D) caption embeddings and (N, D) video embeddings of a corpus."""
    model.eval()
    videos = [
        model.embed_videos(*_video_batch(corpus, torch.arange(s, min(s + batch_size, len(corpus.video_ids)))))
        for s in range(0, len(corpus.video_ids), batch_size)
    ]
    return model.embed_texts(text_vectors), torch.cat(videos)


def evaluate_retrieval(
    model: RetrievalModel, corpus: RetrievalCorpus, text_vectors: Tensor, *, chunk_size: int = 1024
) -> dict[str, float]:
    """R@1/5/10, MedR, MeanR for text-to-video (``t2v_``) and video-to-text (``v2t_``),
    and the chance recall of each direction (``chance_t2v_R@K``...)."""
    texts, videos = embed_corpus(model, corpus, text_vectors)
    out: dict[str, float] = {}
    for name, queries, gallery, q_ids, g_ids in (
        ("t2v_", texts, videos, corpus.caption_video, corpus.video_ids),
        ("v2t_", videos, texts, corpus.video_ids, corpus.caption_video),
    ):
        targets = query_targets(q_ids, g_ids)
        ranks = retrieval_ranks(queries, gallery, targets, chunk_size=chunk_size)
        out.update(retrieval_metrics(ranks, len(g_ids)).as_dict(name))
        out.update({f"chance_{name}R@{k}": v for k, v in chance_recall(targets).items()})
    return out


def _loss(settings: RetrievalSettings, scores: Tensor, positives: Tensor) -> Tensor:
    if settings.loss == "margin":
        return max_margin_ranking_loss(scores, positives, margin=settings.margin)
    if settings.loss == "infonce":
        return info_nce_loss(scores, positives, temperature=settings.temperature)
    raise ValueError(f"unknown loss {settings.loss!r}; expected 'margin' or 'infonce'")


def fine_tuned_parameters(encoder) -> list[torch.nn.Parameter]:
    """The parameters of a text encoder that ``--text-lr`` trains (an error if it has none)."""
    parameters = [p for p in getattr(encoder, "parameters", lambda: [])() if p.requires_grad]
    if not parameters:
        raise ValueError(f"the text encoder {type(encoder).__name__} has nothing to fine-tune "
                         "(bag of words, or built frozen); drop --text-lr")
    return parameters


def parameter_groups(model: torch.nn.Module, encoder, text_lr: float | None) -> list[dict]:
    """The optimizer's parameter groups: the model's, and the text encoder's at ``text_lr``
    when it is fine-tuned (``text_lr`` not None)."""
    groups = [{"params": list(model.parameters())}]
    if text_lr is not None:
        if encoder is None:
            raise ValueError("text_lr is set but no text encoder was given to fine-tune")
        groups.append({"params": fine_tuned_parameters(encoder), "lr": text_lr})
    return groups


def own_group(groups: list[dict], params, **options) -> list[dict]:
    """``groups`` with ``params`` moved from the first group (the model's) into a group of
    their own with ``options`` (``lr``, ``weight_decay``), placed last."""
    params = list(params)
    ids = {id(p) for p in params}
    rest = [p for p in groups[0]["params"] if id(p) not in ids]
    return [{**groups[0], "params": rest}, *groups[1:], {"params": params, **options}]


def split_man_branch(groups: list[dict], model: RetrievalModel, man_lr: float | None) -> list[dict]:
    """``groups`` with the parameters of MAN's video branch (MAN, its output map, the absent
    steps) in their own group at ``man_lr`` (:func:`own_group`); as they are without
    ``man_lr``. Only where MAN is a branch beside another fusion."""
    if man_lr is None:
        return groups
    video = model.video
    if video.fusion_name not in ("gating+man", "mean+man"):
        raise ValueError(f"man_lr applies to MAN as a branch (gating+man, mean+man), not to {video.fusion_name}")
    branch = [*video.fusion.parameters(), *video.fused_output.parameters(), *video.absent.parameters()]
    return own_group(groups, branch, lr=man_lr)


def train_retrieval(
    train: RetrievalCorpus,
    train_text: Tensor,
    val: RetrievalCorpus,
    val_text: Tensor,
    settings: RetrievalSettings,
    seed: int,
    *,
    encoder=None,
) -> tuple[RetrievalModel, list[dict[str, float]]]:
    """Train a :class:`RetrievalModel`; return the best-on-validation model and the history.

    With ``settings.text_lr`` the text ``encoder`` (built trainable) is fine-tuned with the
    model, at that learning rate: each batch encodes its captions with gradients, each
    validation encodes the validation captions afresh, and the encoder is left at its
    best-on-validation state. ``train_text`` and ``val_text`` give the text size only then.
    """
    training_autocast(settings.precision)  # an unknown precision fails before any work
    seed_everything(seed)
    expert_dims = [e.dim for e in train.experts.values()]
    options = dict(settings.fusion_options)
    if "man" in settings.fusion.split("+"):
        options.setdefault("seed", seed)
    model = RetrievalModel(
        train_text.shape[1], expert_dims, embed_dim=settings.embed_dim, fusion=settings.fusion,
        hidden_dim=settings.hidden_dim, fusion_options=options, man_layer_norm=settings.man_layer_norm,
        man_zero_init=settings.man_zero_init,
    )
    groups = split_man_branch(parameter_groups(model, encoder, settings.text_lr), model, settings.man_lr)
    optimizer = torch.optim.AdamW(groups, lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    generator = torch.Generator().manual_seed(seed)
    captions_of: dict[str, list[int]] = {}
    for i, video in enumerate(train.caption_video):
        captions_of.setdefault(video, []).append(i)
    history, best, best_text, best_score = [], None, None, float("-inf")
    for epoch in range(settings.epochs):
        model.train()
        if settings.text_lr is not None:
            encoder.train()
        start, total, steps = time.perf_counter(), 0.0, 0
        order = torch.randperm(len(train.video_ids), generator=generator)
        for s in range(0, len(order), settings.batch_size):
            rows = order[s : s + settings.batch_size]
            if len(rows) < 2:
                continue
            picks = [
                captions_of[train.video_ids[r]][
                    int(torch.randint(len(captions_of[train.video_ids[r]]), (1,), generator=generator))
                ]
                for r in rows.tolist()
            ]
            with training_autocast(settings.precision):
                if settings.text_lr is None:
                    texts = model.embed_texts(train_text[picks])
                else:
                    texts = model.embed_texts(encoder([train.captions[i] for i in picks]).sentence)
                videos = model.embed_videos(*_video_batch(train, rows))
                loss = _loss(settings, texts @ videos.T, torch.eye(len(rows), dtype=torch.bool))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        if settings.text_lr is not None:
            encoder.eval()
            val_text = encode_captions(encoder, val.captions)  # the encoder has changed: no cache
        metrics = evaluate_retrieval(model, val, val_text, chunk_size=settings.chunk_size)
        score = sum(v for k, v in metrics.items() if "R@" in k and not k.startswith("chance"))
        history.append({"epoch": epoch, "loss": total / max(steps, 1), "val_rsum": score,
                        "seconds": time.perf_counter() - start})
        if score > best_score:
            best_score, best = score, copy.deepcopy(model.state_dict())
            best_text = copy.deepcopy(encoder.state_dict()) if settings.text_lr is not None else None
    if best is not None:
        model.load_state_dict(best)
        if best_text is not None:
            encoder.load_state_dict(best_text)
    if encoder is not None and settings.text_lr is not None:
        encoder.eval()
    return model, history
