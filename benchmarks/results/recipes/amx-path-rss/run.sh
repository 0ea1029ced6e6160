#!/usr/bin/env bash
# multi30k's resident memory on the path training takes where oneDNN runs AMX (runtime.kernel_builds_costly: the
# products on the token budget's rows, nn.linear.stable_rows, and attention's products in float32), forced on a CPU
# without AMX, against the path this CPU takes: the two paths' memory side by side on one machine, when no AMX Xeon is
# at hand. ROUNDS rounds (default 2) of STEPS updates (default 300) a side, the order turning each round; per run the
# peak of metrics.csv's peak_rss_mb and the whole process's from /usr/bin/time -v, and the mean step over updates
# 50-STEPS. Run from the repository root, alone:
#   bash benchmarks/results/recipes/amx-path-rss/run.sh > benchmarks/results/recipes/amx-path-rss/runs.txt
set -euo pipefail
cd "$(dirname "$0")/../../../.."
rounds=${ROUNDS:-2}; steps=${STEPS:-300}; root=runs/amx-path-rss
. benchmarks/results/recipes/commit-data.sh
[ -d "$root/data" ] || prepare_data "$root/data" multi30k attnkit
export OMP_NUM_THREADS=2
git log -1 --format="%h %ad %s" --date=iso
grep -m1 'model name' /proc/cpuinfo
train() {  # PATH_NAME: prints the mean step (ms), metrics.csv's peak and the whole process's (MiB)
    local out="$root/$1"
    local code="from attnkit.cli.main import main; raise SystemExit(main())"
    local costly='lambda device, dtype: device.type == "cpu" and dtype == "bfloat16"'  # as on a CPU with AMX
    [ "$1" = amx-path ] && code="import attnkit.train.trainer as t; t.kernel_builds_costly = $costly; $code"
    rm -rf "$out"
    /usr/bin/time -v -o "$root/$1.time" python3 -c "$code" train --config multi30k \
        --data "$root/data" --out "$out" --quiet --train.max_steps="$steps" > "$root/$1.log" 2>&1 \
        || { echo "$1 failed (exit $?), the end of $root/$1.log:" >&2; tail -3 "$root/$1.log" >&2; return 1; }
    local kb; kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$root/$1.time")
    echo "$(step_and_peak "$out/metrics.csv" "$steps") $(awk -v kb="$kb" 'BEGIN { printf "%.1f", kb / 1024 }')"
}
for ((r = 1; r <= rounds; r++)); do
    order=(this-cpu amx-path); ((r % 2 == 0)) && order=(amx-path this-cpu)
    for side in "${order[@]}"; do
        read -r ms peak whole < <(train "$side")
        echo "round $r $side: $ms ms a step (updates 50-$steps), peak_rss_mb $peak, whole process $whole MiB"
    done
done
