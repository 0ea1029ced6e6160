#!/usr/bin/env bash
# One 60-minute preset trained by two commits of attnkit back to back on an otherwise idle machine (docs/speed.md):
# how many more updates the same budget holds, and whether dev holds up.
#   bash benchmarks/results/recipes/before-after.sh 68b66df^ HEAD multi30k       # ~2 h 05 min on 2 cores
#   TAG=epyc bash benchmarks/results/recipes/before-after.sh 68b66df^ HEAD lm-word-wt2
#   MINUTES=5 TAG=5min bash benchmarks/results/recipes/before-after.sh 68b66df^ HEAD multi30k  # a shorter budget
# 68b66df is the first commit of issue #42 (training speed), so 68b66df^ is the code before it. Each commit runs from
# a worktree of its own (runs/before-after/before, .../after), prepares its own data (the prepared format changed
# between them) with the preset's command from ../shared/data, then trains the preset as written at that commit. Logs:
# benchmarks/results/recipes/before-after-PRESET.{before,after}.* (output with /usr/bin/time's wall time and peak
# RSS, metrics.csv, train.log) and before-after-PRESET.md, the summary.
set -euo pipefail
cd "$(dirname "$0")/../../.."
before=${1:?the commit before}; after=${2:?the commit after}; preset=${3:?multi30k or lm-word-wt2}
case "$preset" in multi30k|lm-word-wt2) ;; *) echo "usage: $0 BEFORE AFTER multi30k|lm-word-wt2" >&2; exit 2 ;; esac
root=runs/before-after; logs=benchmarks/results/recipes/before-after-$preset${TAG:+-$TAG}
. benchmarks/results/recipes/commit-data.sh
export OMP_NUM_THREADS=2
budget=(); [ -n "${MINUTES:-}" ] && budget=(--train.max_minutes="$MINUTES")
mkdir -p "$root"
step() {  # NAME COMMAND...: the command's output and /usr/bin/time's figures in $logs.NAME.log
    local name=$1; shift
    /usr/bin/time -v -o "$logs.$name.time" "$@" > "$logs.$name.log" 2>&1
    grep -E "Elapsed|Maximum resident" "$logs.$name.time" >> "$logs.$name.log"; rm "$logs.$name.time"
}
run_commit() {  # LABEL REV: prepare and train the preset with that commit's code
    local label=$1 wt="$root/$1"
    worktree_with_data "$wt" "$2" "$preset"
    git -C "$wt" log -1 --format="$label: %h %ad %s" --date=iso > "$logs.$label.commit"
    # shellcheck disable=SC2046  # the verb is one or two words
    step "$label" env PYTHONPATH="$PWD/$wt/src" python3 -m attnkit $(train_verb "$preset") --config "$preset" \
        --data "$wt/data" --out "$wt/run" --quiet ${budget[@]+"${budget[@]}"}
    cp "$wt/run/metrics.csv" "$logs.$label.metrics.csv"; cp "$wt/run/train.log" "$logs.$label.train.log"
}
run_commit after "$after"
run_commit before "$before"
python3 - "$logs" "$preset" "${MINUTES:-60}" <<'PY'
import csv, re, sys
logs, preset, minutes = sys.argv[1:]
rows = {}
for label in ("before", "after"):
    metrics = list(csv.DictReader(open(f"{logs}.{label}.metrics.csv", encoding="utf-8")))
    dev = [r for r in metrics if r["split"] == "valid"]
    key, better = ("bleu", max) if preset == "multi30k" else ("ppl", min)
    devs = [float(r[key]) for r in dev if r.get(key)]
    log = open(f"{logs}.{label}.log", encoding="utf-8").read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)[1]) / 1024
    rows[label] = (max(int(r["step"]) for r in metrics), better(devs), devs[-1], rss, key,
                   open(f"{logs}.{label}.commit", encoding="utf-8").read().strip())
b, a = rows["before"], rows["after"]
lines = [f"# `{preset}`, {minutes} minutes, before and after", "", *(f"- {rows[k][5]}" for k in ("before", "after")),
         "",
         f"| code | updates | best dev {b[4]} | last dev {b[4]} | peak RSS (MiB) |", "|---|---:|---:|---:|---:|"]
lines += [f"| {k} | {r[0]:,} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:,.0f} |" for k, r in (("before", b), ("after", a))]
lines += ["", f"after ÷ before: {a[0] / b[0]:.2f}× the updates (goal ≥ 1.3×); best dev {a[1] - b[1]:+.2f}"]
open(f"{logs}.md", "w", encoding="utf-8").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
