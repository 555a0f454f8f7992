#!/usr/bin/env bash
# The two backbone settings of MAN (appendix H.1) on CMU-MOSI utterance features, the
# paper's Table 3 layout: backbone alone, + MAN, + MAN w/o CAO / w/o LSC / w/o HAD,
# 5 seeds each (configs/mosi/backbones/). Results: docs/RESULTS.md, "Backbones".
# Needs ../shared/data/mosi/mosi_utterance.npz (see docs/TRAINING.md) or POLYFUSE_MOSI_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PF=${PF:-polyfuse}
DATA=${POLYFUSE_MOSI_PATH:-../shared/data/mosi/mosi_utterance.npz}
OUT=${OUT:-runs/mosi_backbones}
SEEDS=${SEEDS:-5}
B=configs/mosi/backbones

for backbone in mult lstm_lmf; do
  $PF compare --config $B/base.yaml --data "$DATA" --seeds "$SEEDS" --out "$OUT/$backbone" --no-progress --quiet \
      --models $B/$backbone.yaml,$B/${backbone}_man.yaml,$B/${backbone}_man_wo_cao.yaml,$B/${backbone}_man_wo_lsc.yaml,$B/${backbone}_man_wo_had.yaml
done
