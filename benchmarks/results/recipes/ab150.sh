#!/usr/bin/env bash
# The training step of two commits on one machine, taking turns: 150 updates of the multi30k preset in bf16, 2 rounds,
# each commit from a worktree of its own on the data of runs/multi30k/data (README "Multi30k"). Printed per run: the
# median and mean step from metrics.csv (updates 21-150), the peak RSS by updates 60 and 150, and the whole process's.
#   bash benchmarks/results/recipes/ab150.sh 8b24351 5d4be19 > benchmarks/results/recipes/ab150-8b24351-5d4be19.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
revs=("${1:?the commit before}" "${2:?the commit after}")
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; git worktree add -f --detach "runs/ab-$rev" "$rev" > /dev/null 2>&1; done
for round in 1 2; do
  for rev in "${revs[@]}"; do
    rm -rf runs/ab-run
    /usr/bin/time -v -o runs/ab.time env PYTHONPATH="$PWD/runs/ab-$rev/src" python3 -m attnkit train --config multi30k \
      --data runs/multi30k/data --out runs/ab-run --quiet --force --train.max_steps=150 --train.max_minutes=0 \
      --train.log_every=1 --train.dtype=bfloat16 > runs/ab.log 2>&1
    python3 - "$rev" "$round" <<'PY'
import csv, re, statistics, sys
rows = [r for r in csv.DictReader(open("runs/ab-run/metrics.csv")) if r["split"] == "train"]
t = [float(r["elapsed_s"]) for r in rows]
d = [b - a for a, b in zip(t[19:], t[20:])]
peak60 = next(float(r["peak_rss_mb"]) for r in rows if r["step"] == "60")
whole = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open("runs/ab.time").read())[1]) / 1024
print(f"{sys.argv[1]} round {sys.argv[2]}: median step {statistics.median(d) * 1e3:.1f} ms, mean "
      f"{statistics.mean(d) * 1e3:.1f}; 150 updates at {t[-1]:.1f} s; peak RSS by update 60 {peak60:.0f} MiB, by 150 "
      f"{float(rows[-1]['peak_rss_mb']):.0f}, whole process {whole:.0f}")
PY
  done
done
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; done
git worktree prune
