#!/usr/bin/env bash
# The lm-word-wt2 step of a68e3c8 and 8750714 (400 updates, 2 rounds): with ab150.sh's flags (bf16, horizon steps) and as
# before-after.sh runs the preset (dtype auto, horizon time); the mean step over updates 50-400, 50-200 and 200-400.
#   bash benchmarks/results/recipes/wt2-flags.sh > benchmarks/results/recipes/wt2-flags-a68e3c8-8750714.txt
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
[ -f runs/wt2-word/data/corpus.safetensors ] || { echo "runs/wt2-word/data is missing: ab150.sh ... lm-word-wt2 prepares it" >&2; exit 2; }
revs=(a68e3c8 8750714)
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; git worktree add -f --detach "runs/ab-$rev" "$rev" > /dev/null 2>&1; done
for round in 1 2; do
 for variant in ab pair; do
  for rev in "${revs[@]}"; do
    rm -rf runs/ab-run
    if [ $variant = ab ]; then extra=(--train.horizon=steps --train.max_minutes=0 --train.log_every=50 --train.dtype=bfloat16)
    else extra=(); fi
    env PYTHONPATH="$PWD/runs/ab-$rev/src" python3 -m attnkit lm train --config lm-word-wt2 --data runs/wt2-word/data \
      --out runs/ab-run --quiet --force --train.max_steps=400 "${extra[@]}" > runs/ab.log 2>&1
    python3 - "$rev" "$round" "$variant" <<'PY'
import csv, sys
rows = {r["step"]: float(r["elapsed_s"]) for r in csv.DictReader(open("runs/ab-run/metrics.csv")) if r["split"] == "train"}
print(f"{sys.argv[3]:5s} {sys.argv[1]} round {sys.argv[2]}: updates 50-400 {1e3 * (rows['400'] - rows['50']) / 350:.1f} ms each; 50-200 {1e3 * (rows['200'] - rows['50']) / 150:.1f}; 200-400 {1e3 * (rows['400'] - rows['200']) / 200:.1f}", flush=True)
PY
  done
 done
done
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; done
git worktree prune
echo done
