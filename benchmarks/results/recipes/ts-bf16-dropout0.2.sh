#!/bin/bash
cd "$(dirname "$0")/../../.."  # the repository root: the runs go to runs/, as they did
s=$(date +%s)
attnkit lm train --config lm-char-small --data runs/ablation-ts/data --out runs/ts-trial1 --quiet \
  --train.dtype=bfloat16 --model.dropout=0.2 --train.horizon=time --train.max_steps=100000
echo "train rc $? $(( $(date +%s) - s )) s"
attnkit lm eval --checkpoint runs/ts-trial1/checkpoints/best.safetensors --data runs/ablation-ts/data --tgt-len 64 --mem-len 192
echo "eval rc $? $(( $(date +%s) - s )) s"
