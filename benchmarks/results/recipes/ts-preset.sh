#!/bin/bash
# The Tiny Shakespeare preset as the tour runs it (docs/cli.md), timed with nothing else on the machine.
cd "$(dirname "$0")/../../.."  # the repository root
S=../shared/data/tiny_shakespeare
s=$(date +%s)
[ -f runs/shakespeare/data/corpus.safetensors ] || \
  attnkit lm prepare --train $S/input.txt.gz --valid-fraction 0.1 --level char --out runs/shakespeare/data
attnkit lm train --config lm-char-small --data runs/shakespeare/data --out runs/shakespeare/lm --quiet
echo "train rc $? $(( $(date +%s) - s )) s"
attnkit lm eval --checkpoint runs/shakespeare/lm/checkpoints/best.safetensors --data runs/shakespeare/data
echo "eval rc $? $(( $(date +%s) - s )) s"
