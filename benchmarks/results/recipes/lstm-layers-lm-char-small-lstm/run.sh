#!/bin/bash
# run from the repository root, OLD_TREE=a worktree of the code before (affc7b8)
mkdir -p runs/lstm-recipe
for side in old new new old; do
  if [ $side = old ]; then src="$OLD_TREE"/src; else src="$PWD"/src; fi
  out=runs/lstm-recipe/$side-$((++n))
  PYTHONPATH=$src python3 -m attnkit lm train --config lm-char-small-lstm --data runs/shakespeare/data --out $out --force --quiet --train.max_steps=1000 > $out.log 2>&1
  echo "$side $out rc $?" >> runs/lstm-recipe/done.txt
done
echo done >> runs/lstm-recipe/done.txt
