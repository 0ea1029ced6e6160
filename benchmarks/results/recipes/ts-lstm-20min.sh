#!/bin/bash
cd "$(dirname "$0")/../../.."  # the repository root: the runs go to runs/, as they did
s=$(date +%s)
attnkit lm train --config lm-char-small-lstm --data runs/ablation-ts/data --out runs/ts-lstm20 --quiet \
  --train.max_minutes=20 --train.horizon=time --train.max_steps=1000000
echo "train rc $? $(( $(date +%s) - s )) s"
attnkit lm eval --checkpoint runs/ts-lstm20/checkpoints/best.safetensors --data runs/ablation-ts/data --tgt-len 64 --mem-len 192
echo "eval rc $? $(( $(date +%s) - s )) s"
