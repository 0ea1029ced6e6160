#!/usr/bin/env bash
# rnn-bahdanau, 3 epochs (384 updates) from the code before the projected loss (5b5f7a5) and after (AFTER, default
# HEAD), one after the other, each from a worktree of its own with its data prepared by its own code; the dev loss and
# BLEU after each epoch land in runs/rnn-projected/SIDE/run/metrics.csv. From the repository root:
#   bash benchmarks/results/recipes/rnn-projected-loss/run.sh [AFTER]
set -euo pipefail
. benchmarks/results/recipes/commit-data.sh
export OMP_NUM_THREADS=2
root=runs/rnn-projected
for side in before after; do
    rev=5b5f7a5; [ $side = after ] && rev=$(git rev-parse --short "${1:-HEAD}")
    worktree_with_data "$root/$side" "$rev" rnn-bahdanau
    /usr/bin/time -v -o "$root/$side.time" env PYTHONPATH="$PWD/$root/$side/src" python3 -m attnkit train \
        --config rnn-bahdanau --data "$root/$side/data" --out "$root/$side/run" --quiet --force \
        --train.max_steps=384 --train.max_minutes=0 > "$root/$side.log" 2>&1
    echo "$side $rev: $(grep Maximum "$root/$side.time")"
done
