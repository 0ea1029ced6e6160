#!/usr/bin/env bash
# The training step of two commits on one machine, taking turns: 150 updates of a preset in bf16 (STEPS=N for another
# count), 2 rounds, each commit from a worktree of its own. multi30k trains on runs/multi30k/data (README "Multi30k");
# lm-word-wt2 on runs/wt2-word/data, prepared from ../shared/data/wikitext-2 when it is missing. Printed per run: the
# median and mean step from metrics.csv (updates 21 on), the peak RSS by update 60 and by the last, and the whole
# process's, its minor page faults and the training loss at the last update. DTYPE=float32 trains in float32.
#   bash benchmarks/results/recipes/ab150.sh 8b24351 5d4be19 > benchmarks/results/recipes/ab150-8b24351-5d4be19.txt
#   STEPS=300 bash benchmarks/results/recipes/ab150.sh a68e3c8 b0d7ec3 lm-word-wt2
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=2
revs=("${1:?the commit before}" "${2:?the commit after}"); preset=${3:-multi30k}; steps=${STEPS:-150}
dtype=${DTYPE:-bfloat16}
case "$preset" in
  multi30k) train=(train --config multi30k --data runs/multi30k/data) ;;
  lm-word-wt2)
    W=../shared/data/wikitext-2
    [ -f runs/wt2-word/data/corpus.safetensors ] || python3 -m attnkit lm prepare --train "$W/wiki.train.tokens.gz" \
      --valid "$W/wiki.valid.tokens.gz" --level word --out runs/wt2-word/data > /dev/null
    # the preset's cosine decays over its 60 minutes; over a fixed count of updates here
    train=(lm train --config lm-word-wt2 --data runs/wt2-word/data --train.horizon=steps) ;;
  *) echo "usage: $0 BEFORE AFTER [multi30k|lm-word-wt2]" >&2; exit 2 ;;
esac
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; git worktree add -f --detach "runs/ab-$rev" "$rev" > /dev/null 2>&1; done
for round in 1 2; do
  for rev in "${revs[@]}"; do
    rm -rf runs/ab-run
    /usr/bin/time -v -o runs/ab.time env PYTHONPATH="$PWD/runs/ab-$rev/src" python3 -m attnkit "${train[@]}" \
      --out runs/ab-run --quiet --force --train.max_steps="$steps" --train.max_minutes=0 \
      --train.log_every=1 --train.dtype="$dtype" > runs/ab.log 2>&1
    python3 - "$rev" "$round" <<'PY'
import csv, re, statistics, sys
rows = [r for r in csv.DictReader(open("runs/ab-run/metrics.csv")) if r["split"] == "train"]
t = [float(r["elapsed_s"]) for r in rows]
d = [b - a for a, b in zip(t[19:], t[20:])]
peak60 = next(float(r["peak_rss_mb"]) for r in rows if r["step"] == "60")
timed = open("runs/ab.time").read()
whole = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timed)[1]) / 1024
faults = int(re.search(r"Minor \(reclaiming a frame\) page faults: (\d+)", timed)[1])
print(f"{sys.argv[1]} round {sys.argv[2]}: median step {statistics.median(d) * 1e3:.1f} ms, mean "
      f"{statistics.mean(d) * 1e3:.1f}; {len(t)} updates at {t[-1]:.1f} s; peak RSS by update 60 {peak60:.0f} MiB, "
      f"by {len(t)} {float(rows[-1]['peak_rss_mb']):.0f}, whole process {whole:.0f}; {faults:,} minor page faults; "
      f"loss at update {len(t)} {rows[-1]['loss']}")
PY
  done
done
for rev in "${revs[@]}"; do rm -rf "runs/ab-$rev"; done
git worktree prune
