#!/usr/bin/env bash
# Regenerates the CMU-MOSI tables of docs/RESULTS.md: bc-LSTM features, split_bclstm,
# 5 seeds per model, each run testing its best validation checkpoint once. MAN, its
# ablations (MAN Table 3), BAN, and the baselines with their papers' subnetworks (TFN,
# LMF) and Concat, all run the same way by configs/mosi/man.yaml (no skip, centre marker).
# Needs ../shared/data/mosi/mosi_utterance.npz (see docs/TRAINING.md) or POLYFUSE_MOSI_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PF=${PF:-polyfuse}
DATA=${POLYFUSE_MOSI_PATH:-../shared/data/mosi/mosi_utterance.npz}
OUT=${OUT:-runs/mosi}
SEEDS=${SEEDS:-5}

$PF compare --config configs/mosi/man.yaml --data "$DATA" \
    --models man,configs/mosi/man_wo_cao.yaml,configs/mosi/man_wo_had.yaml,configs/mosi/man_wo_lsc.yaml,ban,tfn,lmf,concat \
    --seeds "$SEEDS" --out "$OUT/all" --no-progress --quiet
