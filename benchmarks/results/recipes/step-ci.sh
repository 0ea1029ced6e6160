#!/usr/bin/env bash
# The training step of two commits as their presets are written, with a 95% confidence interval: ROUNDS rounds
# (default 8) of STEPS updates (default 400) a side, the order turning each round (before-after, after-before, ...),
# so a drift of the machine's speed over the run falls on both sides alike. Each commit runs from a worktree of its own
# and prepares its own data (the prepared format changed at #42), as before-after.sh does; only the step count is
# overridden, so each side trains in the dtype its preset names. Per run: the mean step over updates 50 to STEPS
# (metrics.csv, one row every 50). The summary is the geometric mean of the rounds' before / after ratios and a
# t interval on their logarithms: what a 60-minute pair's update ratio would be without the machine's noise, less
# the evaluations (each side's share of the hour is in its pair's metrics.csv).
#   bash benchmarks/results/recipes/step-ci.sh 68b66df^ HEAD lm-word-wt2 > benchmarks/results/recipes/step-ci-wt2.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
before=${1:?the commit before}; after=${2:?the commit after}; preset=${3:?multi30k or lm-word-wt2}
rounds=${ROUNDS:-8}; steps=${STEPS:-400}
((rounds >= 2 && rounds <= 16)) || { echo "ROUNDS must be 2-16" >&2; exit 2; }
root=runs/step-ci
. benchmarks/results/recipes/commit-data.sh
export OMP_NUM_THREADS=2
train() {  # LABEL: STEPS updates of the preset; prints the mean step over updates 50 to STEPS (ms), the peak RSS (MiB)
    local wt="$root/$1"
    rm -rf "$wt/run"
    # shellcheck disable=SC2046  # the verb is one or two words
    env PYTHONPATH="$PWD/$wt/src" python3 -m attnkit $(train_verb "$preset") --config "$preset" --data "$wt/data" \
        --out "$wt/run" --quiet --train.max_steps="$steps" > "$root/$1.log" 2>&1
    step_and_peak "$wt/run/metrics.csv" "$steps"
}
for side in before after; do
    rev=$before; [ $side = after ] && rev=$after
    worktree_with_data "$root/$side" "$rev" "$preset"
    git -C "$root/$side" log -1 --format="$side: %h %ad %s" --date=iso
done
declare -a b_ms a_ms
for ((r = 1; r <= rounds; r++)); do
    order=(before after); ((r % 2 == 0)) && order=(after before)
    for side in "${order[@]}"; do
        read -r ms rss < <(train "$side")
        if [ "$side" = before ]; then b_ms+=("$ms"); else a_ms+=("$ms"); fi
        echo "round $r $side: $ms ms a step (updates 50-$steps), peak RSS $rss MiB"
    done
done
python3 - "${b_ms[*]}" "${a_ms[*]}" <<'PY'
import math, statistics, sys
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]
b, a = ([float(x) for x in s.split()] for s in sys.argv[1:3])
logs = [math.log(x / y) for x, y in zip(b, a)]
mean, sem = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
half = T975[len(logs) - 2] * sem  # Student's t, 95% two-sided, len - 1 degrees of freedom
print(f"before: mean step {statistics.mean(b):.1f} ms (rounds {min(b):.1f}-{max(b):.1f}); "
      f"after: {statistics.mean(a):.1f} ms ({min(a):.1f}-{max(a):.1f})")
print(f"before / after: {math.exp(mean):.3f}x, 95% interval {math.exp(mean - half):.3f}-{math.exp(mean + half):.3f}x "
      f"over {len(logs)} rounds")
PY
for side in before after; do rm -rf "${root:?}/$side"; done
git worktree prune
