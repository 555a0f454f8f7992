"""Task type ``chimera``: Chimera (topic, hyperbolic and matching layers) between MiniLM's
token states and one video expert, for text-video retrieval; every row of the paper's
Table 4 is a configuration (configs/msvd/chimera/).

Objective (Chimera Eq. 13, weights of sec. 4.2): 0.5 L_T + 0.5 L_TLM + 0.5 L_HLM + 0.5 L_D
+ 1.0 L_O, where L_O is the ranking objective of the scorer (bidirectional max-margin
with hardest negatives over the batch's caption x video score matrix) and L_T (Eq. 3) the
topic-marginalised likelihood of the masked word pieces through the text topic layer and
a masked-LM head W_{V|Z} tied to MiniLM's word embeddings (:mod:`polyfuse.tasks.chimera.lm`,
trained once before the first epoch and cached by content; frozen here).

Training follows Table 4's protocol (sec. 4.4): in every training step ``mask_rate``
(20%) of each caption's word pieces are replaced by [MASK] before the encoder reads them
(the targets of L_T) and as many of each video's steps are dropped
(:mod:`polyfuse.functional.chimera_masking`), the masks drawn from a generator seeded
by the run's seed and the epoch (a resumed run draws the same). With ``train_shuffle_words``
the words of every training caption are also shuffled afresh each epoch, as sec. 4.4 says
(:mod:`polyfuse.tasks.chimera.shuffling`; before the masks are drawn). Validation and test
read everything unmasked and score every caption against every video of the split
(the model is a cross-encoder). A batch is distinct videos, one caption each
(:class:`polyfuse.tasks.ranking.data.DistinctVideoBatches`).

Under DDP (``trainer.devices > 1``) every process draws the word and region masks of the
global batch (one process's draw) and embeds its share of it; the video sides are gathered
with their gradients so that each process scores its captions against every video of the
batch, the score rows are gathered into the (B, B) matrix, and L_TLM, L_HLM and L_D run on
the gathered sides (:mod:`polyfuse.tasks.ranking.gather`): every term is that of the whole batch,
as one process computes it. At evaluation each process scores its share of the captions
against every video of the split and the score rows are gathered
(:class:`~polyfuse.metrics.retrieval.TextVideoRetrieval`): every process ranks the whole
split.

Logged: ``train/loss`` and each term (``train/model_loss``, ``train/topic_lm``,
``train/topic_matching``, ``train/hyperbolic_matching``, ``train/distortion``), the
learned scalars (``train/omega_t``, ``train/omega_v``, ``train/beta``, ``train/c``...);
``val/`` and ``test/`` recalls, MedR, MeanR and ``rsum``; with masking and topic layers,
``val/topic_lm`` (L_T on fixed masked validation captions), ``val/head_nll`` and
``val/identity_topic`` (:func:`held_out_topic_lm`).

MiniLM stays frozen and outside the module's state (its weights are the package's);
fine-tuning it is not offered on this path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from polyfuse.data.formats.experts import RetrievalCorpus
from polyfuse.functional.chimera_losses import chimera_objective, topic_matching_loss
from polyfuse.functional.chimera_masking import drop_regions
from polyfuse.functional.chimera_word_losses import (
    word_region_distortion_loss,
    word_region_matching_loss,
)
from polyfuse.functional.contrastive import max_margin_ranking_loss
from polyfuse.metrics.retrieval import TextVideoRetrieval
from polyfuse.nn.models.chimera import ChimeraRetrievalModel
from polyfuse.progress import Stopwatch, progress_bar, run_display, say
from polyfuse.seeds import epoch_seed
from polyfuse.sizes import MAX_SIZE
from polyfuse.tasks.chimera.lm import encode_ids, lm_head_for, mask_batch, masked_batch, tokenized
from polyfuse.tasks.chimera.shuffling import shuffle_word_pieces, word_tables
from polyfuse.tasks.optim import OptimSettings, build_optimizer
from polyfuse.tasks.ranking.data import (
    CORPUS_SPLITS,
    ONE_PROCESS,
    RetrievalSourceConfig,
    Shard,
    load_corpus,
)
from polyfuse.tasks.ranking.gather import gather_rows, gather_sum
from polyfuse.tasks.ranking.groups import own_group
from polyfuse.tasks.ranking.module import RankingTask
from polyfuse.tasks.ranking.spec import (
    SHUFFLED,
    RankingSpec,
    cache_dir_of,
    ranking_data,
    select_splits,
)
from polyfuse.tasks.registry import TaskData, register_task

__all__ = [
    "ABLATION_ROWS", "HELD_OUT_CAPTIONS", "HELD_OUT_MASK_SEED", "TABLE4_ROWS", "ChimeraConfig", "ChimeraSpec",
    "ChimeraTask", "encode_tokens", "held_out_masked_captions", "held_out_topic_lm", "learned_scalars",
]

#: The switches of each row of Table 4, top to bottom (the defaults of ChimeraConfig are the
#: first row, the whole model): Z and TLM variant (topic layers), N, HLM, L_D (hyperbolic layer).
ABLATION_ROWS: dict[str, dict[str, Any]] = {
    "Z20-af-N20-HLM-LD": {},
    "Z20-ad-N20-HLM": {"topic_variant": "addition", "distortion": False},
    "Z20-mu-N20-HLM": {"topic_variant": "multiplication", "distortion": False},
    "Z20-af-N20-HLM-noLD": {"distortion": False},
    "Z20-noTLM-N20-HLM-LD": {"tlm": False},
    "Z10-af-N20-HLM-LD": {"num_topics": 10},
    "Z0-N20-HLM-LD": {"num_topics": 0, "tlm": False},
    "Z20-af-N20-noHLM-noLD": {"hlm": False, "distortion": False},
    "Z20-af-N10-HLM-LD": {"hyperbolic_dim": 10},
    "Z20-af-N0": {"hyperbolic_dim": 0, "hlm": False, "distortion": False},
    # not a row of the paper's table: the first row without L_T, to see what L_T adds
    "Z20-af-N20-HLM-LD-noLT": {"topic_lm": False},
}
TABLE4_ROWS = list(ABLATION_ROWS)[:10]


class ChimeraConfig(RetrievalSourceConfig):
    """Chimera for retrieval (task.type chimera): the corpus, the expert, the row's switches, the protocol."""

    expert: str | None = Field(None, description="the video expert Chimera reads (null: the corpus's first, MSVD's vgg_appearance)")
    encoder_path: str | None = Field(
        None, description="a MiniLM-format folder (null: the packaged all-MiniLM-L6-v2); relative to the config file")
    num_topics: Annotated[int, Field(ge=0, le=MAX_SIZE)] = Field(20, description="Z, topics of each topic layer (0: no topic layers)")
    topic_variant: Literal["affine", "addition", "multiplication"] = Field("affine", description="topic transform (Eq. 5)")
    tlm: bool = Field(True, description="train L_TLM (topic matching, Eq. 10)")
    hyperbolic_dim: Annotated[int, Field(ge=0, le=MAX_SIZE)] = Field(20, description="N, the hyperbolic dimension (0: no hyperbolic layer)")
    hlm: bool = Field(True, description="train L_HLM (word-region matching, Eq. 11)")
    distortion: bool = Field(True, description="train L_D (distortion, Eq. 12)")
    topic_lm: bool = Field(True, description="train L_T (Eq. 3) where there are topic layers and masking")
    mask_rate: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.2, description="share of word pieces ([MASK], the targets of L_T) and of video steps dropped per training step")
    scalar_lr: Annotated[float, Field(gt=0.0)] | None = Field(
        None, description="learning rate of the scalars omega_t, omega_v, beta, c (no weight decay; null: optim.lr)")
    tlm_temperature: Annotated[float, Field(gt=0.0)] = Field(1.0, description="divisor of L_TLM's inner products (the paper: 1)")
    tlm_symmetric: bool = Field(
        True, description="L_TLM averaged over both directions, text to video and video to text (false: the paper's "
        "Eq. 10, each text against the batch's videos only)")
    train_shuffle_words: bool = Field(
        False, description="shuffle the words of every training caption afresh each epoch (sec. 4.4, the protocol of "
        "Table 4; seeded by seed, epoch and caption)")
    shuffled_test: bool = Field(True, description="after the test, score the test split again with each caption's words shuffled (EX2)")

    @model_validator(mode="after")
    def _consistent(self) -> ChimeraConfig:
        if self.num_topics == 0 and self.tlm:
            raise ValueError("chimera.tlm needs topic layers (num_topics > 0)")
        if self.hyperbolic_dim == 0 and (self.hlm or self.distortion):
            raise ValueError("chimera.hlm and chimera.distortion need the hyperbolic layer (hyperbolic_dim > 0)")
        return self


@torch.no_grad()
def encode_tokens(encoder, captions: Sequence[str], batch_size: int = 128, bar: Any = None) -> tuple[Tensor, Tensor]:
    """(C, N, d) token states of a frozen encoder padded to the longest caption, (C, N) mask;
    ``bar`` (a :func:`polyfuse.progress.progress_bar`) advanced by each batch's captions."""
    split_names = []
    for s in range(0, len(captions), batch_size):
        split_names.append(encoder(list(captions[s : s + batch_size])))
        if bar is not None:
            bar.update(len(split_names[-1].tokens))
    length = max(p.tokens.shape[1] for p in split_names)
    tokens = torch.cat([torch.nn.functional.pad(p.tokens, (0, 0, 0, length - p.tokens.shape[1])) for p in split_names])
    mask = torch.cat([torch.nn.functional.pad(p.mask, (0, length - p.mask.shape[1])) for p in split_names])
    return tokens, mask


def _trim(tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    length = int(mask.sum(1).max())
    return tokens[:, :length], mask[:, :length]


QUERY_VIDEOS = 256  # videos read and scored at a time against one query (polyfuse plot ranking)
HELD_OUT_MASK_SEED = 1234  # the masks of the held-out L_T: the same for every epoch, row and seed
HELD_OUT_CAPTIONS = 64  # validation captions scored for the held-out L_T (cost: ~2 training steps' L_T)


def held_out_masked_captions(encoder, captions: list[str], rate: float, *, count: int = HELD_OUT_CAPTIONS,
                             seed: int = HELD_OUT_MASK_SEED, batch_size: int = 16) -> list[tuple[Tensor, ...]]:
    """The first ``count`` captions, ``rate`` of their word pieces masked by a generator
    seeded with ``seed``, encoded once: batches of ``(hidden, mask, ids, masked)``
    (:func:`~polyfuse.tasks.chimera.lm.masked_batch`). The same masks every call, so a
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


def learned_scalars(model: ChimeraRetrievalModel) -> dict[str, float]:
    """omega_t, omega_v (Eq. 9), beta and c (Eq. 8), omega of the addition topics (Eq. 5)."""
    out = {"omega_t": model.matching.topic_weight.item(), "omega_v": model.matching.visual_weight.item()}
    if model.use_hyperbolic:
        out.update(beta=model.hyperbolic.beta.item(), c=model.hyperbolic.offset.item())
    if model.use_topics and model.text_topic.variant == "addition":
        out.update(omega_text=model.text_topic.addition_weight.item(),
                   omega_image=model.image_topic.addition_weight.item())
    return out


class ChimeraTask(RankingTask):
    """Training and scoring of a :class:`~polyfuse.nn.models.chimera.ChimeraRetrievalModel`.

    ``switches``: the row's ``tlm``, ``hlm``, ``distortion``, ``topic_lm``. The frozen
    ``encoder`` (masked captions are encoded every step) and ``lm_head`` (L_T) are held
    outside the module's state: neither is trained here."""

    def __init__(self, model: ChimeraRetrievalModel, *, switches: Mapping[str, bool], lr: float = 1e-3,
                 weight_decay: float = 1e-4, scalar_lr: float | None = None, mask_rate: float = 0.2,
                 tlm_temperature: float = 1.0, tlm_symmetric: bool = True, train_shuffle_words: bool = False,
                 seed: int = 0, encoder=None, optim: OptimSettings | None = None) -> None:
        super().__init__()
        self.optim_settings = optim if optim is not None else OptimSettings()  # optimiser and schedule
        if mask_rate > 0 and encoder is None:
            raise ValueError("mask_rate > 0 needs the text encoder (masked captions are encoded every step)")
        if train_shuffle_words and encoder is None:
            raise ValueError("train_shuffle_words needs the text encoder (shuffled captions are encoded every step)")
        self.tlm_symmetric, self.train_shuffle_words = bool(tlm_symmetric), bool(train_shuffle_words)
        self._word_tables = None  # (fixed ids, continuation), read from the tokenizer when first needed
        self.model = model
        self.switches = dict(switches)
        self.lr, self.weight_decay, self.scalar_lr = float(lr), float(weight_decay), scalar_lr
        self.mask_rate, self.tlm_temperature, self.seed = float(mask_rate), float(tlm_temperature), int(seed)
        object.__setattr__(self, "encoder", encoder)  # not a submodule: frozen, not in the checkpoint
        object.__setattr__(self, "lm_head", None)  # set by ChimeraSpec.prepare_module
        self.held_out: list[tuple[Tensor, ...]] | None = None  # fixed masked validation captions (held-out L_T)
        self._masks = torch.Generator().manual_seed(self.seed)
        self.start_split()

    def on_train_epoch_start(self) -> None:
        self._masks = torch.Generator().manual_seed(epoch_seed(self.seed, self.current_epoch))

    def _losses(self, text, video, masked_words, sizes: list[int], word_mask: Tensor,
                region_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Eq. 13's total and its terms over the global batch, from this process's share of
        it (``sizes``: every process's rows; one: the whole batch is here).

        ``text`` and ``video``: the sides of the share, the text trimmed to the global
        batch's longest caption; ``word_mask`` (B, N_t) and ``region_mask`` (B, N_v): the
        global batch's masks. ``masked_words``: ``(token_ids, masked, lm_head, total)`` of
        the share (``total`` the masked word pieces of the global batch) or None."""
        every = lambda rows: gather_rows(self, rows, sizes)  # noqa: E731 - (b_r, ...) -> (B, ...)
        videos = video._replace(hidden=every(video.hidden), mask=region_mask, topic_hidden=every(video.topic_hidden))
        scores = every(self.model.score_matrix(text, videos))  # (B, B): each process its captions' rows
        eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
        terms = {"model_loss": max_margin_ranking_loss(scores, eye)}
        if self.switches["topic_lm"] and text.topic_logits is not None and masked_words is not None:
            ids, masked, head, total = masked_words  # Eq. 3, the mean over the global batch's masked pieces
            share = self.model.topic_lm_loss(text, ids, masked, head) * masked.sum()
            terms["topic_lm"] = gather_sum(self, share, len(sizes)) / total
        if self.switches["tlm"] and text.topics is not None:
            terms["topic_matching"] = topic_matching_loss(every(text.topics), every(video.topics),
                                                          symmetric=self.tlm_symmetric,
                                                          temperature=self.tlm_temperature)  # Eq. 10
        if text.points is not None and (self.switches["hlm"] or self.switches["distortion"]):
            word_points, region_points = every(text.points), every(video.points)
            if self.switches["hlm"]:
                terms["hyperbolic_matching"] = word_region_matching_loss(word_points, region_points, word_mask,
                                                                         region_mask)
            if self.switches["distortion"]:
                terms["distortion"] = word_region_distortion_loss(word_points, region_points, every(text.tangents),
                                                                  every(video.tangents), word_mask, region_mask)
        return chimera_objective(**terms), terms  # Eq. 13 with the paper's weights

    def training_ids(self, batch: Mapping[str, Any]) -> Tensor:
        """The global batch's word-piece ids, with ``train_shuffle_words`` each caption's
        words shuffled for this epoch (:func:`~polyfuse.tasks.chimera.shuffling.shuffle_word_pieces`,
        seeded by the run's seed, the epoch and the caption's row); else ``batch["ids"]`` itself."""
        if not self.train_shuffle_words:
            return batch["ids"]
        if self._word_tables is None:
            self._word_tables = word_tables(self.encoder.tokenizer)
        fixed, continuation = self._word_tables
        return shuffle_word_pieces(batch["ids"], batch["id_mask"], batch["caption_rows"], fixed_ids=fixed,
                                   continuation=continuation, seed=self.seed, epoch=self.current_epoch)

    def training_step(self, batch: Mapping[str, Any], batch_index: int) -> Tensor:
        """The objective of the global batch (the masks drawn for it; under DDP this
        process embeds its share, ``batch["shard"]``, and gathers the rest)."""
        video_mask, masked_words = batch["video_mask"], None  # (B, N_v): the global batch's
        size = len(video_mask)
        start, stop = batch.get("shard", (0, size))
        sizes = batch.get("shard_sizes") or [size]
        if self.mask_rate > 0:  # Table 4's protocol: mask words and regions (the words shuffled first, if asked)
            masked_ids, text_mask, ids, masked = mask_batch(self.encoder, self.training_ids(batch), batch["id_mask"],
                                                            self.mask_rate, self._masks)
            video_mask = drop_regions(video_mask, self.mask_rate, self._masks)
            share_mask = text_mask[start:stop]
            text = self.model.texts(encode_ids(self.encoder, masked_ids[start:stop], share_mask), share_mask)
            if self.lm_head is not None:
                masked_words = (ids[start:stop], masked[start:stop], self.lm_head, masked.sum())
        elif "ids" in batch:  # shuffled words, unmasked: the share's captions encoded afresh
            text_mask = batch["id_mask"]
            share_mask = text_mask[start:stop]
            text = self.model.texts(encode_ids(self.encoder, self.training_ids(batch)[start:stop], share_mask),
                                    share_mask)
        else:  # the token states of the share, cut to the global batch's longest caption
            text_mask = batch["text_mask"]
            text = self.model.texts(batch["tokens"], text_mask[start:stop])
        videos = self.model.videos(batch["steps"], video_mask[start:stop])
        loss, terms = self._losses(text, videos, masked_words, sizes, text_mask, video_mask)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=size, sync_dist=True)
        for name, term in terms.items():
            self.log(f"train/{name}", term, on_step=False, on_epoch=True, batch_size=size, sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        # the same numbers on every process (synchronised weights, gathered scores): max keeps them exact
        self.log_dict({f"train/{k}": v for k, v in learned_scalars(self.model).items()}, sync_dist=True, reduce_fx="max")

    # ---- ranking a split (polyfuse.tasks.ranking.module) -----------------------------------
    def start_split(self, *, chance: bool = False, gather: bool = False) -> None:
        self._chance, self._gather = chance, gather
        self._seen = {"tokens": [], "token_mask": [], "steps": [], "video_mask": [], "caption_videos": [],
                      "video_ids": [], "caption_rows": [], "caption_video": []}

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        for key in self._seen:
            value = chunk[key]
            if isinstance(value, Tensor):
                if len(value):
                    self._seen[key].append(value)
            else:
                self._seen[key].extend(value)

    @torch.no_grad()
    def seen_scores(self) -> Tensor:
        """(C, N) scores of the captions seen against the split's videos (every chunk holds them all)."""
        seen = self._seen
        with torch.autocast(device_type=self.device.type, enabled=False):
            text = self.model.texts(*_trim(torch.cat(seen["tokens"]).float(), torch.cat(seen["token_mask"])))
            videos = self.model.videos(torch.cat(seen["steps"]).float(), torch.cat(seen["video_mask"]))
            return self.model.score_matrix(text, videos).float()

    def seen_ids(self, key: str) -> list[str]:
        """The ids seen since :meth:`start_split`: ``caption_videos`` (each caption's video) or ``video_ids``."""
        return list(self._seen[key])

    def split_metrics(self) -> dict[str, float]:
        """The metrics of the captions seen against every video of the split; under DDP
        every process's score rows are gathered first."""
        metric = TextVideoRetrieval(chance=self._chance, sync_on_compute=self._gather)
        metric.update(caption_rows=torch.cat(self._seen["caption_rows"]),
                      caption_video=torch.cat(self._seen["caption_video"]), scores=self.seen_scores())
        return metric.compute()

    def validation_extras(self) -> dict[str, float]:
        """L_T on fixed masked validation captions: its change is the model's."""
        if self.held_out is None or self.lm_head is None:
            return {}
        with torch.autocast(device_type=self.device.type, enabled=False):
            lm = held_out_topic_lm(self.model, self.held_out, self.lm_head)
        return {key.removeprefix("val_"): value for key, value in lm.items()}

    def on_predict_epoch_start(self) -> None:
        self.start_split()

    def predict_step(self, batch: Mapping[str, Any], batch_index: int) -> dict[str, Any]:
        """Keeps the chunk's inputs (the spec's ``records`` scores them all); nothing per batch."""
        self.add_chunk(batch)
        return {}

    def configure_optimizers(self) -> Any:
        """``optim``'s optimiser and schedule (:func:`~polyfuse.tasks.optim.build_optimizer`) over the
        model's parameters at ``optim.lr`` and ``optim.weight_decay`` (biases included), the scalars at
        ``scalar_lr`` without weight decay when it is set; a schedule scales each group's rate."""
        groups = [{"params": list(self.model.parameters())}]
        if self.scalar_lr is not None:  # the scalars in their own group: no weight decay pulls them to 0
            groups = own_group(groups, [p for p in self.model.parameters() if p.numel() == 1], lr=self.scalar_lr,
                               weight_decay=0.0)
        return build_optimizer(groups, self.optim_settings, lr=self.lr, weight_decay=self.weight_decay)


# ---- data -------------------------------------------------------------------------------------
@dataclass
class ChimeraData:
    """The splits of the corpus, the expert read, and the captions as the encoder gives them:
    per evaluation split (C, N, d) token states and (C, N) masks; for training, word-piece
    ids and masks (masked and encoded every step) or, without masking, token states."""

    splits: dict[str, RetrievalCorpus]
    expert: str
    text_dim: int
    tokens: dict[str, tuple[Tensor, Tensor]]
    train_ids: tuple[Tensor, Tensor] | None


class _Batches:
    """The collate function of :class:`RetrievalDataModule` for Chimera."""

    def __init__(self, prepared: ChimeraData) -> None:
        self.prepared = prepared

    def __call__(self, split_name: str, batch, shard: Shard = ONE_PROCESS) -> dict[str, Any]:
        corpus = self.prepared.splits[split_name]
        video = corpus.experts[self.prepared.expert]
        if isinstance(batch, list):  # training: the global batch's (video row, caption row) pairs
            return self._training(video, batch, shard)
        videos, captions = batch["video_rows"], batch["caption_rows"]
        tokens, mask = self.prepared.tokens[split_name]
        row_of = {v: i for i, v in enumerate(corpus.video_ids)}
        caption_videos = [corpus.caption_video[i] for i in captions.tolist()]
        steps, video_mask, _ = video.gather(videos, video.steps)
        return {"steps": steps, "video_mask": video_mask, "tokens": tokens[captions],
                "token_mask": mask[captions], "video_ids": [corpus.video_ids[i] for i in videos.tolist()],
                "caption_videos": caption_videos, "caption_rows": captions,
                "caption_video": torch.tensor([row_of[v] for v in caption_videos], dtype=torch.long)}

    def _training(self, video, pairs: list[tuple[int, int]], shard: Shard) -> dict[str, Any]:
        """The global batch's masks and word-piece ids (the masks are drawn for the whole
        batch), this process's share of the video steps (and of the token states), the
        text cut to the global batch's longest caption; ``shard`` (start, stop) and
        ``shard_sizes`` say which rows are this process's."""
        rows, captions = [v for v, _ in pairs], [c for _, c in pairs]
        start, stop = shard.bounds(len(pairs))
        out: dict[str, Any] = {"steps": video.gather(rows[start:stop], video.steps)[0], "video_mask": video.step_mask(rows),
                               "shard": (start, stop), "shard_sizes": shard.sizes(len(pairs)),
                               "caption_rows": torch.tensor(captions, dtype=torch.long)}
        if self.prepared.train_ids is not None:
            ids, id_mask = self.prepared.train_ids[0][captions], self.prepared.train_ids[1][captions]
            length = int(id_mask.sum(1).max())
            out.update(ids=ids[:, :length], id_mask=id_mask[:, :length])
        else:
            tokens, mask = self.prepared.tokens["train"]
            length = int(mask[captions].sum(1).max())
            out.update(tokens=tokens[captions[start:stop]][:, :length], text_mask=mask[captions][:, :length])
        return out


def _encoder(section: Mapping[str, Any]):
    from polyfuse.nn.sentence_encoder import MiniLMEncoder

    return MiniLMEncoder(section.get("encoder_path"))


def prepare_chimera(config: Mapping[str, Any], encoder, split_names: Sequence[str],
                    display: tuple[bool, bool] = (False, False)) -> ChimeraData:
    """The splits ``split_names`` of the configuration's corpus, their captions' token states encoded
    once (the training captions only tokenised when they are masked or shuffled afresh each epoch).
    ``display``: a progress bar of the captions encoded (on a terminal) and a final line
    on stderr (:func:`polyfuse.progress.run_display`)."""
    section = config["chimera"]
    corpus, split = load_corpus(section)
    expert = section["expert"] or next(iter(corpus.experts))
    if expert not in corpus.experts:
        raise ValueError(f"chimera.expert: unknown expert {expert!r}; the corpus has {', '.join(corpus.experts)}")
    selected = select_splits(corpus, split, split_names)
    # masked or shuffled afresh every step: the training captions are only tokenised
    masked_training = "train" in selected and (section["mask_rate"] > 0 or section.get("train_shuffle_words", False))
    encoded = {name: split_name for name, split_name in selected.items() if not (name == "train" and masked_training)}
    show_bar, show_line = display
    watch, total = Stopwatch(), sum(len(split_name.captions) for split_name in encoded.values())
    with progress_bar(total=total, show=show_bar, desc="encode captions", unit="caption") as bar:
        tokens = {name: encode_tokens(encoder, split_name.captions, bar=bar) for name, split_name in encoded.items()}
    if show_line and total:
        say(f"chimera: {total} captions of {', '.join(encoded)} encoded by {type(encoder).__name__} in {watch}")
    train_ids = tokenized(encoder, selected["train"].captions) if masked_training else None
    return ChimeraData(selected, expert, int(encoder.hidden_size), tokens, train_ids)


def _module(config: Mapping[str, Any], text_dim: int, video_dim: int, encoder) -> ChimeraTask:
    section = config["chimera"]
    model = ChimeraRetrievalModel(text_dim, video_dim, num_topics=section["num_topics"],
                                  topic_variant=section["topic_variant"], hyperbolic_dim=section["hyperbolic_dim"])
    return ChimeraTask(model, switches={k: section[k] for k in ("tlm", "hlm", "distortion", "topic_lm")},
                       lr=config["optim"]["lr"], weight_decay=config["optim"]["weight_decay"],
                       scalar_lr=section["scalar_lr"], mask_rate=section["mask_rate"],
                       tlm_temperature=section["tlm_temperature"], tlm_symmetric=section.get("tlm_symmetric", True),
                       train_shuffle_words=section.get("train_shuffle_words", False), seed=config["seed"],
                       encoder=encoder, optim=OptimSettings.from_config(config))


@register_task
class ChimeraSpec(RankingSpec):
    """``task.type: chimera`` (see the module docstring)."""

    name = "chimera"
    section = "chimera"

    def check_config(self, config: Any) -> None:
        """Chimera has no fusion module: ``model.fusion`` other than its default is refused,
        so that ``polyfuse compare --models concat,...`` cannot train one model twice."""
        super().check_config(config)
        if config.model.fusion != "man":
            raise ValueError(f"model.fusion {config.model.fusion!r} is not read by task.type chimera: its model is "
                             "set in the chimera section (polyfuse compare --models takes chimera configuration "
                             "files, not fusion names)")
    config_sections: ClassVar[dict[str, type]] = {"chimera": ChimeraConfig}
    sections = ("chimera",)
    required_sections = ("chimera",)
    model_sections = ("chimera",)
    path_keys = ("chimera.source", "chimera.captions", "chimera.encoder_path")
    path_mappings = ("chimera.experts", "chimera.splits")

    def build_data(self, config: Mapping[str, Any]) -> TaskData[ChimeraData]:
        encoder = _encoder(config["chimera"])
        split_names = (*CORPUS_SPLITS, SHUFFLED) if config["chimera"]["shuffled_test"] else CORPUS_SPLITS
        prepared = prepare_chimera(config, encoder, split_names, run_display(config))
        data = ranking_data(config, prepared, _Batches(prepared), whole_videos=True)  # a cross-encoder
        data.datamodule.text_encoder = encoder
        return data

    def build_module(self, config: Mapping[str, Any], data: TaskData[ChimeraData]) -> ChimeraTask:
        prepared: ChimeraData = data.prepared
        video_dim = prepared.splits["train"].experts[prepared.expert].dim
        return _module(config, prepared.text_dim, video_dim, data.datamodule.text_encoder)

    def prepare_module(self, module: ChimeraTask, config: Mapping[str, Any], data: TaskData[ChimeraData],
                       resuming: bool) -> dict[str, Any]:
        """L_T's masked-LM head: trained on the training captions (held out: the validation
        captions) or read from ``<output_dir>/.cache``."""
        section = config["chimera"]
        if not (section["mask_rate"] > 0 and section["num_topics"] > 0):
            return {}
        split_names = data.prepared.splits
        head, report = lm_head_for(module.encoder, split_names["train"].captions, split_names["val"].captions,
                                   cache_dir_of(config), display=run_display(config))
        object.__setattr__(module, "lm_head", head)
        if module.model.use_topics:  # L_T on fixed masked validation captions, logged every epoch
            module.held_out = held_out_masked_captions(module.encoder, split_names["val"].captions, section["mask_rate"])
        return {"lm_head": {k: v for k, v in report.items() if k != "history"}}

    def checkpoint_extras(self, config: Mapping[str, Any], data: TaskData[ChimeraData]) -> dict[str, Any]:
        prepared: ChimeraData = data.prepared
        return {"config": dict(config), "modalities": [prepared.expert],
                "input_dims": [prepared.splits["train"].experts[prepared.expert].dim],
                "label_info": {"text_dim": prepared.text_dim}, "stats": {}}

    def after_test(self, module: ChimeraTask, data: TaskData[ChimeraData], run_dir: Path) -> dict[str, Any]:
        out = super().after_test(module, data, run_dir)
        return {**out, "learned_scalars": learned_scalars(module.model)} if out else out

    def module_from_extras(self, extras: Mapping[str, Any]) -> ChimeraTask:
        config = extras["config"]
        return _module({**config, "chimera": {**config["chimera"], "mask_rate": 0.0, "train_shuffle_words": False}},
                       int(extras["label_info"]["text_dim"]), int(extras["input_dims"][0]), None)

    def split_data(self, extras: Mapping[str, Any], split_name: str, encoder=None) -> TaskData[ChimeraData]:
        """The data of one split; ``encoder``: MiniLM when the caller holds it already."""
        config = extras["config"]
        prepared = prepare_chimera(config, encoder or _encoder(config["chimera"]), (split_name,))
        return ranking_data(config, prepared, _Batches(prepared), whole_videos=True)

    def split_scores(self, module: ChimeraTask, outputs: Sequence[Any],
                     corpus: RetrievalCorpus) -> tuple[Tensor, list[str], list[str]]:
        # predict_step keeps every chunk in the module; the outputs are empty
        return module.seen_scores(), module.seen_ids("caption_videos"), module.seen_ids("video_ids")

    def query_scores(self, module: ChimeraTask, extras: Mapping[str, Any], data: TaskData[ChimeraData], text: str,
                     caption: int | None) -> Tensor:
        prepared: ChimeraData = data.prepared
        if caption is not None:
            tokens, mask = (x[caption : caption + 1] for x in prepared.tokens[data.split])
        else:
            tokens, mask = encode_tokens(_encoder(extras["config"]["chimera"]), [text])
        video = prepared.splits[data.split].experts[prepared.expert]
        model = module.model.eval()
        scores = []
        with torch.no_grad():
            text = model.texts(*_trim(tokens, mask))
            for start in range(0, len(video.video_ids), QUERY_VIDEOS):
                steps, step_mask, _ = video.gather(range(start, min(start + QUERY_VIDEOS, len(video.video_ids))),
                                                   video.steps)
                scores.append(model.score_matrix(text, model.videos(steps, step_mask))[0])
        return torch.cat(scores)

    def attention_figures(self, module: ChimeraTask, extras: Mapping[str, Any], out: Path, *, split: str,
                          sample: int, source: str | None, modalities: Sequence[str] | None) -> list[Path]:
        """The hyperbolic layer's attention over the ``sample``-th caption of ``split`` and
        its video (:mod:`polyfuse.tasks.chimera.figure`)."""
        from polyfuse.tasks.chimera.figure import plot_pair_attention

        split_name = self.checkpoint_split(split, source=source, modalities=modalities)
        encoder = _encoder(extras["config"]["chimera"])  # its states and its word pieces
        data = self.split_data(extras, split_name, encoder)
        data.split = split_name
        return [plot_pair_attention(module, encoder, data, out, split=split, sample=sample)]
