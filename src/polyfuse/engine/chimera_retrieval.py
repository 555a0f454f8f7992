"""Chimera retrieval runs: the whole objective weighted as in the paper, Table 4's ablation rows.

Objective (Chimera Eq. 13, weights of sec. 4.2): 0.5 L_T + 0.5 L_TLM + 0.5 L_HLM + 0.5 L_D
+ 1.0 L_O, where L_O is the ranking objective of the scorer (bidirectional max-margin
with hardest negatives over the batch's caption x video score matrix) and L_T (Eq. 3) the
topic-marginalised likelihood of the masked word pieces through the text topic layer and
a masked-LM head W_{V|Z} tied to MiniLM's word embeddings
(:mod:`polyfuse.engine.chimera_lm`, trained once and cached; frozen here).

Training follows Table 4's protocol (sec. 4.4): in every training step 20% of each
caption's word pieces are replaced by [MASK] before the encoder reads them (the targets
of L_T) and 20% of each video's steps are dropped
(:mod:`polyfuse.functional.chimera_masking`); validation and test read everything
unmasked. Training runs up to ``epochs`` epochs and stops after ``patience`` epochs
without a better validation recall sum; the best epoch is kept.

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
from polyfuse.engine.chimera_lm import masked_batch, tokenized
from polyfuse.engine.retrieval import own_group, parameter_groups, training_autocast
from polyfuse.engine.seeding import seed_everything
from polyfuse.functional.chimera_losses import chimera_objective, topic_matching_loss
from polyfuse.functional.chimera_masking import drop_regions
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
from polyfuse.nn.models.chimera import ChimeraRetrievalModel

__all__ = [
    "ABLATION_ROWS", "HELD_OUT_CAPTIONS", "HELD_OUT_MASK_SEED", "TABLE4_ROWS", "ChimeraRow", "encode_tokens",
    "evaluate_chimera", "held_out_masked_captions", "held_out_topic_lm", "learned_scalars", "train_chimera",
]


@dataclass(frozen=True)
class ChimeraRow:
    """One row of Table 4: Z and TLM variant (topic layer), N, HLM, L_D (hyperbolic layer);
    ``topic_lm``: train L_T (Eq. 3) when there are topic layers (every row of the paper)."""

    num_topics: int = 20
    topic_variant: str = "affine"
    tlm: bool = True
    hyperbolic_dim: int = 20
    hlm: bool = True
    distortion: bool = True
    topic_lm: bool = True


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
    # not a row of the paper's table: the first row without L_T, to see what L_T adds
    "Z20-af-N20-HLM-LD-noLT": ChimeraRow(topic_lm=False),
}
TABLE4_ROWS = list(ABLATION_ROWS)[:10]

HELD_OUT_MASK_SEED = 1234  # the masks of the held-out L_T: the same for every epoch, row and seed
HELD_OUT_CAPTIONS = 64  # validation captions scored for the held-out L_T (cost: ~2 training steps' L_T)


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


def held_out_masked_captions(encoder, captions: list[str], rate: float, *, count: int = HELD_OUT_CAPTIONS,
                             seed: int = HELD_OUT_MASK_SEED, batch_size: int = 16) -> list[tuple[Tensor, ...]]:
    """The first ``count`` captions, ``rate`` of their word pieces masked by a generator
    seeded with ``seed``, encoded once: batches of ``(hidden, mask, ids, masked)``
    (:func:`~polyfuse.engine.chimera_lm.masked_batch`). The same masks every call, so a
    loss on them changes from epoch to epoch only because the model does."""
    if count < 1 or not captions:
        raise ValueError(f"held-out L_T needs at least one caption, got count={count}, {len(captions)} captions")
    ids, mask = tokenized(encoder, captions[:count])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return [masked_batch(encoder, ids[s : s + batch_size], mask[s : s + batch_size], rate, generator)
                for s in range(0, len(ids), batch_size)]


@torch.no_grad()
def held_out_topic_lm(model: ChimeraRetrievalModel, batches: list[tuple[Tensor, ...]], lm_head) -> dict[str, float]:
    """L_T (Eq. 3) on fixed masked captions (:func:`held_out_masked_captions`), the mean over
    all their masked word pieces (``val_topic_lm``); beside it the frozen head's own NLL on
    the same word pieces (``val_head_nll``: the topic mixture with all weight on the
    identity topic T_0) and the mean prior weight of that topic, P(z = 0 | x_\\t)
    (``val_identity_topic``)."""
    model.eval()
    lt, head, identity, count = 0.0, 0.0, 0.0, 0
    for hidden, mask, ids, masked in batches:
        text = model.texts(hidden, mask)
        m = int(masked.sum())
        lt += float(model.topic_lm_loss(text, ids, masked, lm_head)) * m
        head += float(torch.nn.functional.cross_entropy(lm_head(hidden[masked]), ids[masked], reduction="sum"))
        identity += float(torch.softmax(text.topic_logits[masked], dim=-1)[:, 0].sum())
        count += m
    return {"val_topic_lm": lt / count, "val_head_nll": head / count, "val_identity_topic": identity / count}


def _losses(model, row: ChimeraRow, text, video, scores: Tensor, masked_words=None,
            tlm_temperature: float = 1.0) -> tuple[Tensor, dict]:
    """Eq. 13's total and its terms (floats). ``masked_words``: ``(token_ids, masked, lm_head)``
    for L_T, or None."""
    eye = torch.eye(scores.shape[0], dtype=torch.bool)
    terms = {"model_loss": max_margin_ranking_loss(scores, eye)}
    if row.topic_lm and text.topic_logits is not None and masked_words is not None:
        terms["topic_lm"] = model.topic_lm_loss(text, *masked_words)  # Eq. 3
    if row.tlm and text.topics is not None:
        terms["topic_matching"] = topic_matching_loss(text.topics, video.topics, symmetric=True,
                                                      temperature=tlm_temperature)  # Eq. 10
    if row.hlm and text.points is not None:
        terms["hyperbolic_matching"] = word_region_matching_loss(text.points, video.points, text.mask, video.mask)
    if row.distortion and text.points is not None:
        terms["distortion"] = word_region_distortion_loss(
            text.points, video.points, text.tangents, video.tangents, text.mask, video.mask
        )
    total = chimera_objective(**terms)  # Eq. 13 with the paper's weights
    return total, {name: term.item() for name, term in terms.items()}


def learned_scalars(model: ChimeraRetrievalModel) -> dict[str, float]:
    """The learned scalars: omega_t, omega_v (Eq. 9), beta and c (Eq. 8), omega of the
    addition topics (Eq. 5) of each topic layer."""
    out = {"omega_t": model.matching.topic_weight.item(), "omega_v": model.matching.visual_weight.item()}
    if model.use_hyperbolic:
        out.update(beta=model.hyperbolic.beta.item(), c=model.hyperbolic.offset.item())
    if model.use_topics and model.text_topic.variant == "addition":
        out.update(omega_text=model.text_topic.addition_weight.item(),
                   omega_image=model.image_topic.addition_weight.item())
    return out


def train_chimera(train: RetrievalCorpus, train_tokens: tuple[Tensor, Tensor], val: RetrievalCorpus,
                  val_tokens: tuple[Tensor, Tensor], row: ChimeraRow, seed: int, *, epochs: int = 10,
                  batch_size: int = 16, lr: float = 1e-3, expert: str = "vgg_appearance",
                  encoder=None, text_lr: float | None = None, precision: str = "32-true",
                  mask_rate: float = 0.0, lm_head=None, patience: int | None = None,
                  scalar_lr: float | None = None, tlm_temperature: float = 1.0):
    """Train on one caption per video per step; keep the epoch with the best val recall sum.

    With ``mask_rate`` > 0 (Table 4's protocol: 0.2) each step masks that share of the
    captions' word pieces (read by ``encoder``, a :class:`~polyfuse.nn.sentence_encoder.MiniLMEncoder`,
    afresh each step) and drops that share of the video steps; with an ``lm_head`` and a
    row with ``topic_lm`` and topics, L_T is trained at the masked word pieces. Without
    masking the captions' states are ``train_tokens`` (computed once). ``patience``: stop
    after that many epochs without a better validation recall sum (None: run all ``epochs``).
    ``scalar_lr``: the learning rate of the model's scalar parameters (omega_t, omega_v,
    beta, c, the addition omegas; None: ``lr``). ``tlm_temperature``: the divisor of
    L_TLM's inner products (the paper's 1 by default).

    With ``text_lr`` the text ``encoder`` (built trainable) is fine-tuned with the model at
    that rate: each batch's captions are encoded with gradients, the validation captions
    afresh every epoch, and the encoder is left at its best-on-validation state; the
    token tensors then give only the text size. ``precision``: ``"32-true"`` or
    ``"bf16-mixed"`` (training steps under CPU bfloat16 autocast).

    Returns the model and the history: per epoch the mean of each loss term over the
    steps, the validation recall sum, the learned scalars (:func:`learned_scalars`) and,
    with masking, an ``lm_head`` and topic layers, L_T on fixed masked validation captions
    (:func:`held_out_topic_lm`: the first :data:`HELD_OUT_CAPTIONS`, masks drawn once with
    :data:`HELD_OUT_MASK_SEED`), whose epoch-to-epoch change is the model's alone.
    """
    training_autocast(precision)  # an unknown precision fails before any work
    if mask_rate > 0 and encoder is None:
        raise ValueError("mask_rate > 0 needs the text encoder (masked captions are encoded every step)")
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be at least 1 epoch, got {patience}")
    seed_everything(seed)
    video = train.experts[expert]
    model = ChimeraRetrievalModel(train_tokens[0].shape[-1], video.dim, num_topics=row.num_topics,
                                  topic_variant=row.topic_variant, hyperbolic_dim=row.hyperbolic_dim)
    groups = parameter_groups(model, encoder, text_lr)
    if scalar_lr is not None:  # the scalars in their own group: no weight decay pulls them to 0
        groups = own_group(groups, [p for p in model.parameters() if p.numel() == 1], lr=scalar_lr, weight_decay=0.0)
    optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=1e-4)
    rng = random.Random(seed)
    masks = torch.Generator().manual_seed(seed)
    caption_ids = tokenized(encoder, train.captions) if mask_rate > 0 else None
    held_out = None  # L_T on fixed masked validation captions every epoch (rows without L_T too; frozen encoder)
    if mask_rate > 0 and lm_head is not None and model.use_topics and text_lr is None:
        held_out = held_out_masked_captions(encoder, val.captions, mask_rate)
    captions_of: dict[str, list[int]] = {}
    for i, v in enumerate(train.caption_video):
        captions_of.setdefault(v, []).append(i)
    history, best, best_text, best_score, best_epoch = [], None, None, float("-inf"), -1
    for epoch in range(epochs):
        model.train()
        if text_lr is not None:
            encoder.train()
        start, sums, steps = time.perf_counter(), {}, 0
        order = list(range(len(train.video_ids)))
        rng.shuffle(order)
        for s in range(0, len(order) - 1, batch_size):
            rows = order[s : s + batch_size]
            if len(rows) < 2:
                continue
            picks = [rng.choice(captions_of[train.video_ids[r]]) for r in rows]
            masked_words, video_mask = None, video.mask[rows]
            with training_autocast(precision):
                if mask_rate > 0:  # Table 4's protocol: mask words and regions
                    hidden, text_mask, ids, masked = masked_batch(encoder, caption_ids[0][picks],
                                                                  caption_ids[1][picks], mask_rate, masks)
                    text = model.texts(hidden, text_mask)
                    video_mask = drop_regions(video_mask, mask_rate, masks)
                    masked_words = (ids, masked, lm_head) if lm_head is not None else None
                elif text_lr is None:
                    text = model.texts(*_trim(train_tokens[0][picks], train_tokens[1][picks]))
                else:
                    encoded = encoder([train.captions[i] for i in picks])
                    text = model.texts(encoded.tokens, encoded.mask)
                vids = model.videos(video.features[rows], video_mask)
                loss, terms = _losses(model, row, text, vids, model.score_matrix(text, vids), masked_words,
                                      tlm_temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            for name, value in {"loss": loss.item(), **terms}.items():
                sums[name] = sums.get(name, 0.0) + value
        if text_lr is not None:
            encoder.eval()
            val_tokens = encode_tokens(encoder, val.captions)  # the encoder has changed
        metrics = evaluate_chimera(model, val, *val_tokens, expert=expert)
        score = sum(v for k, v in metrics.items() if "R@" in k and not k.startswith("chance"))
        lm = held_out_topic_lm(model, held_out, lm_head) if held_out is not None else {}
        history.append({"epoch": epoch, **{k: v / steps for k, v in sums.items()}, "val_rsum": score, **lm,
                        **learned_scalars(model), "seconds": time.perf_counter() - start})
        if score > best_score:
            best_score, best_epoch, best = score, epoch, copy.deepcopy(model.state_dict())
            best_text = copy.deepcopy(encoder.state_dict()) if text_lr is not None else None
        elif patience is not None and epoch - best_epoch >= patience:
            break
    model.load_state_dict(best)
    if best_text is not None:
        encoder.load_state_dict(best_text)
        encoder.eval()
    return model, history
