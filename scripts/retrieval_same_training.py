"""Train ``man`` and ``mean`` briefly (400 synthetic videos, 3 epochs, seed 0, one thread)
with the polyfuse on ``PYTHONPATH``; save the final state dicts and the histories and test
metrics, so that two source trees can be compared bitwise:

    PYTHONPATH=/old/src python scripts/retrieval_same_training.py runs/check/old
    PYTHONPATH=src python scripts/retrieval_same_training.py runs/check/new
    # then torch.equal on every tensor of runs/check/{old,new}_{man,mean}.pt, == on the .json
"""
import json
import sys

import torch

import polyfuse
from polyfuse.engine.retrieval import (
    RetrievalSettings,
    encode_captions,
    evaluate_retrieval,
    train_retrieval,
)
from polyfuse.engine.retrieval_runs import load_corpus, text_encoder

torch.set_num_threads(1)
corpus, split = load_corpus("synthetic:videos=400,steps=4")
parts = {n: corpus.subset(split[n]) for n in ("train", "val", "test")}
enc = text_encoder("bow", corpus)
vec = {n: encode_captions(enc, p.captions) for n, p in parts.items()}
out = {}
for fusion in ("man", "mean"):
    s = RetrievalSettings(fusion=fusion, epochs=3, batch_size=64, embed_dim=64, hidden_dim=32)
    model, history = train_retrieval(parts["train"], vec["train"], parts["val"], vec["val"], s, 0)
    torch.save(model.state_dict(), sys.argv[1] + f"_{fusion}.pt")
    out[fusion] = {"history": [{k: v for k, v in h.items() if k != "seconds"} for h in history],
                   "test": evaluate_retrieval(model, parts["test"], vec["test"])}
with open(sys.argv[1] + ".json", "w") as handle:
    json.dump(out, handle, indent=1)
print(polyfuse.__file__)
