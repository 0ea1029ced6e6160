#!/usr/bin/env bash
# How many oneDNN kernels ("primitives") a preset's training builds an update, and the milliseconds they take, in bf16
# with oneDNN's cache holding each given number of kernels. A kernel is built for each product shape not in the cache;
# the builds are CPU time the step spends outside the products. Counted from ONEDNN_VERBOSE's `create:cache_miss`
# lines in two runs, of 20 and 60 updates: their difference over 40 is the steady state (the first updates' builds and
# the final evaluation's are in both, and cancel). PYTHONPATH=WORKTREE/src measures another commit.
#   bash benchmarks/kernel_builds.sh lm-word-wt2 runs/wt2-word/data 32 64 128
#   bash benchmarks/kernel_builds.sh multi30k runs/multi30k/data 32
set -euo pipefail
preset=${1:?preset}; data=${2:?prepared data folder}; shift 2
cmd=(train); case "$preset" in lm-*) cmd=(lm train --train.eval_interval=100000) ;; esac  # an LM: no evaluation
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
builds() {  # CAP STEPS: "<kernels built> <ms building> <products run>" over the whole run
    ONEDNN_VERBOSE=all ONEDNN_PRIMITIVE_CACHE_CAPACITY=$1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} \
        python3 -m attnkit "${cmd[@]}" --config "$preset" --data "$data" --out "$out/run" --quiet --force \
        --train.max_steps="$2" --train.dtype=bfloat16 > "$out/verbose" 2>&1
    awk -F, '$1 == "onednn_verbose" && $3 == "primitive" { if ($4 == "create:cache_miss") { n++; ms += $NF }
             else if ($4 == "exec") runs++ } END { printf "%d %.3f %d\n", n, ms, runs }' "$out/verbose"
}
for cap in "${@:-32}"; do
    read -r n20 ms20 runs20 < <(builds "$cap" 20)
    read -r n60 ms60 runs60 < <(builds "$cap" 60)
    awk -v cap="$cap" -v n="$((n60 - n20))" -v ms60="$ms60" -v ms20="$ms20" -v runs="$((runs60 - runs20))" \
        -v all="$n60" \
        'BEGIN { printf "%5d kept: %5.1f kernels built an update, %5.1f ms (updates 21-60); %d products an update; " \
                 "%d built in the 60-update run\n", cap, n / 40, (ms60 - ms20) / 40, runs / 40, all }'
done
