#!/bin/bash
# A Multi30k probe: `attnkit train --config multi30k` plus overrides, then the recipe's evaluation (val chooses).
# usage: [VOCAB=8000] bash benchmarks/probe_multi30k.sh NAME [--model.FIELD=VALUE ...]   (VOCAB: the joint BPE size, data in runs/multi30k[-vVOCAB])
# It scores val only; the run chosen on val is then scored on test too: python3 benchmarks/multi30k.py --run runs/NAME
cd "$(dirname "$0")/.."  # the repository root
name=$1; shift
D=../shared/data/multi30k
s=$(date +%s)
V=${VOCAB:-8000}; data=runs/multi30k/data; [ "$V" = 8000 ] || data=runs/multi30k-v$V/data
[ -f $data/train.safetensors ] || attnkit prepare --src de --tgt en --train $D/train --valid $D/val \
  --test $D/test_2016_flickr --vocab-size $V --out $data
attnkit train --config multi30k "$@" --data $data --out runs/$name --quiet --force
echo "train rc $? $(( $(date +%s) - s )) s"
python3 benchmarks/multi30k.py --run runs/$name --data $D --sets val  # test only for the run chosen on val
echo "eval rc $? $(( $(date +%s) - s )) s"
