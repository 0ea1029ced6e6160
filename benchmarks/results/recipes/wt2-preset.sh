#!/bin/bash
# The WikiText-2 preset as docs/results.md runs it, timed with nothing else on the machine.
cd "$(dirname "$0")/../../.."  # the repository root
W=../shared/data/wikitext-2
s=$(date +%s)
[ -f runs/wt2/data/corpus.safetensors ] || attnkit lm prepare --train $W/wiki.train.tokens.gz \
  --valid $W/wiki.valid.tokens.gz --test $W/wiki.test.tokens.gz --level word --out runs/wt2/data
attnkit lm train --config lm-word-wt2 --data runs/wt2/data --out runs/wt2/xl --quiet
echo "train rc $? $(( $(date +%s) - s )) s"
attnkit lm eval --checkpoint runs/wt2/xl/checkpoints/best.safetensors --data runs/wt2/data --split test
echo "eval rc $? $(( $(date +%s) - s )) s"
