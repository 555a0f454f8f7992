#!/usr/bin/env bash
# Regenerates the tables of docs/RESULTS.md: CMU-MOSI (bc-LSTM features), split_bclstm,
# 5 seeds per model, each run testing its best validation checkpoint once.
# Needs ../shared/data/mosi/mosi_utterance.npz (see docs/TRAINING.md) or POLYFUSE_MOSI_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PF=${PF:-.venv/bin/polyfuse}
DATA=${POLYFUSE_MOSI_PATH:-../shared/data/mosi/mosi_utterance.npz}
OUT=${OUT:-runs/mosi}
SEEDS=${SEEDS:-5}

# 1. Contextual MAN against the baselines, all run the same way (configs/mosi/man.yaml).
$PF compare --config configs/mosi/man.yaml --data "$DATA" --models man,ban,tfn,lmf,concat \
    --seeds "$SEEDS" --out "$OUT/models" --no-progress --quiet

# 2. The ablations of MAN Table 3.
$PF compare --config configs/mosi/man.yaml --data "$DATA" \
    --models configs/mosi/man.yaml,configs/mosi/man_wo_cao.yaml,configs/mosi/man_wo_had.yaml,configs/mosi/man_wo_lsc.yaml \
    --seeds "$SEEDS" --out "$OUT/ablations" --no-progress --quiet
