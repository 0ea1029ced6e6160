#!/bin/bash
# The peak RSS of 300 updates of lm-char-small-lstm, old (OLD_TREE, a worktree of affc7b8) or new (this tree), with
# glibc's malloc keeping freed memory (kept, as `attnkit lm train` runs) or as the system sets it (sys):
#   OLD_TREE=... bash benchmarks/results/recipes/lstm-layers-lm-char-small-lstm/rss.sh old kept   (from the repository root)
side=$1; malloc=$2
if [ "$side" = old ]; then src="$OLD_TREE"/src; else src="$PWD"/src; fi
out=runs/rss/$side-$malloc
mkdir -p runs/rss
ATTNKIT_SYSTEM_MALLOC=$([ "$malloc" = sys ] && echo 1 || echo 0) PYTHONPATH=$src /usr/bin/time -v \
  python3 -m attnkit lm train --config lm-char-small-lstm --data runs/shakespeare/data --out $out --force --quiet \
  --train.max_steps=${STEPS:-300} > $out.log 2>&1
echo "$side $malloc $(grep Maximum $out.log)"
