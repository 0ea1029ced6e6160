#!/usr/bin/env bash
# One direction of the Tatoeba recipes (docs/results.md "Tatoeba Chinese-English") end to end, one step after
# another on an otherwise idle machine, each step's output and wall time / peak RSS (/usr/bin/time) in
# runs/tatoeba-hour/tatoeba-DIR.*.log:
#   bash benchmarks/tatoeba_hour.sh zh-en   # ~2 h 25 min on 2 cores: attnkit's hour, then fairseq's
#   TAG=epyc bash benchmarks/tatoeba_hour.sh en-zh   # logs as tatoeba-en-zh-epyc.*: a second machine
# 1. attnkit prepare (the preset's command), 2. attnkit train --config tatoeba-DIR (60 min), 3. benchmarks/tatoeba.py
# (chooses on dev, scores dev and test), 4. benchmarks/fairseq_tatoeba.sh (the baseline's hour on the same data),
# 5. the baseline's last checkpoint decoded and scored the same way (CKPT=checkpoint_last GENERATE_ONLY=1): dev
# chooses between it and fairseq's checkpoint_best, as it chooses among attnkit's checkpoints. The three results.md
# together are what benchmarks/results/tatoeba/DIR-*.md keeps.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?zh-en or en-zh}; src=${dir%-*}; tgt=${dir#*-}
case "$dir" in zh-en|en-zh) ;; *) echo "usage: $0 zh-en|en-zh" >&2; exit 2 ;; esac
D=../shared/data/tatoeba-cmn-eng; run=runs/tatoeba-$dir; mkdir -p runs/tatoeba-hour; logs=runs/tatoeba-hour/tatoeba-$dir${TAG:+-$TAG}
export OMP_NUM_THREADS=2
step() {  # NAME COMMAND...: the command's output and /usr/bin/time's figures in $logs.NAME.log
    local name=$1; shift
    /usr/bin/time -v -o "$logs.$name.time" "$@" > "$logs.$name.log" 2>&1
    grep -E "Elapsed|Maximum resident" "$logs.$name.time" >> "$logs.$name.log"; rm "$logs.$name.time"
}
[ -f "$run/data/train.safetensors" ] || step prepare attnkit prepare --src "$src" --tgt "$tgt" --train $D/train \
    --valid $D/dev --test $D/test --vocab-size 8000 --normalization identity --character-coverage 1.0 \
    --out "$run/data"
step train attnkit train --config "tatoeba-$dir" --data "$run/data" --out "$run" --quiet
step eval python3 benchmarks/tatoeba.py --run "$run" --direction "$dir"
cp "$run/results.md" "$logs.results.md"; cp "$run/results.json" "$logs.results.json"
step fairseq env DIR="$dir" bash benchmarks/fairseq_tatoeba.sh "runs/fairseq-tatoeba-$dir"
cp "runs/fairseq-tatoeba-$dir/hyp/results.md" "$logs.fairseq.results.md"
cp "runs/fairseq-tatoeba-$dir/hyp/results.json" "$logs.fairseq.results.json"
step fairseq-last env CKPT=checkpoint_last GENERATE_ONLY=1 DIR="$dir" bash benchmarks/fairseq_tatoeba.sh \
    "runs/fairseq-tatoeba-$dir"
cp "runs/fairseq-tatoeba-$dir/hyp-last/results.md" "$logs.fairseq-last.results.md"
cp "runs/fairseq-tatoeba-$dir/hyp-last/results.json" "$logs.fairseq-last.results.json"
