"""Tiny Chimera inputs: a 1-layer BERT of hidden size 8 saved as a MiniLM folder (nothing
downloads), 12 videos of one expert with two captions each, and the ``task.type chimera``
configuration that reads them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tests.tiny import TRAINER

#: the words of the tiny BERT's vocabulary (after its five special tokens) and of the captions
WORDS = ["dog", "cat", "car", "man", "runs", "sits", "a"]


def write_tiny_bert(folder: Path) -> Path:
    """A 1-layer BERT of hidden size 8 over :data:`WORDS`, saved as a MiniLM folder."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocabulary = {word: i for i, word in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    BertTokenizerFast(vocab=vocabulary).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    BertModel(config).save_pretrained(folder)
    return folder


def write_corpus_files(folder: Path) -> dict:
    """12 videos of one expert ('app'), two captions each, split 8 / 2 / 2; the ``chimera`` section's keys."""
    g = np.random.default_rng(1)
    ids = [f"v{i}" for i in range(12)]
    np.savez(folder / "app.npz", video_ids=np.array(ids), features=g.standard_normal((12, 5, 6)).astype("float32"))
    captions = {v: [f"a {WORDS[(i + k) % 4]} {WORDS[4 + i % 2]} {WORDS[(i + 1) % 4]}" for k in range(2)]
                for i, v in enumerate(ids)}
    (folder / "captions.json").write_text(json.dumps(captions))
    for name, part in (("train", ids[:8]), ("val", ids[8:10]), ("test", ids[10:])):
        (folder / f"{name}.txt").write_text("\n".join(part) + "\n")
    return {"experts": {"app": str(folder / "app.npz")}, "captions": str(folder / "captions.json"),
            "splits": {n: str(folder / f"{n}.txt") for n in ("train", "val", "test")}}


def chimera_config(folder: Path) -> dict:
    """The corpus and the tiny BERT (in ``folder / "bert"``) written, and a configuration of
    3 topics in a 3-d hyperbolic space that reads them, writing under ``folder / "runs"``."""
    return {
        "output_dir": str(folder / "runs"),
        "task": {"type": "chimera"},
        "chimera": {**write_corpus_files(folder), "encoder_path": str(write_tiny_bert(folder / "bert")),
                    "num_topics": 3, "hyperbolic_dim": 3},
        "data": {"batch_size": 4, "eval_batch_size": 8},
        "trainer": dict(TRAINER),
    }
