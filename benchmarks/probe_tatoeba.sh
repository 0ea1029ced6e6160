#!/bin/bash
# A Tatoeba probe: `attnkit train --config tatoeba-DIR` plus overrides, then the recipe's evaluation on dev only.
# usage: [DIR=zh-en|en-zh] [MIN=60] [VOCAB=8000] [NORM=identity] [COV=1.0] [SEP=1] bash benchmarks/probe_tatoeba.sh NAME [--model.FIELD=VALUE ...]
#   DIR: the direction (preset tatoeba-DIR); MIN: train.max_minutes; VOCAB, NORM, COV, SEP: prepare's --vocab-size,
#   --normalization, --character-coverage and --separate-vocab (the data folder is named after them and made once)
# It scores dev only (never test); the run chosen on dev is then scored on test too:
#   python3 benchmarks/tatoeba.py --run runs/NAME --direction DIR
# and a prepared folder's ceiling (its target tokenizer's round trip of the dev references):
#   python3 benchmarks/tatoeba.py --ceiling runs/tatoeba-DIR-*/data
cd "$(dirname "$0")/.."  # the repository root
name=$1; shift
D=../shared/data/tatoeba-cmn-eng
DIR=${DIR:-zh-en}; src=${DIR%-*}; tgt=${DIR#*-}
V=${VOCAB:-8000}; N=${NORM:-identity}; C=${COV:-1.0}
data=runs/tatoeba-$DIR-v$V-$N-c$C${SEP:+-sep}/data
s=$(date +%s)
[ -f $data/train.safetensors ] || attnkit prepare --src $src --tgt $tgt --train $D/train --valid $D/dev \
  --test $D/test --vocab-size $V --normalization $N --character-coverage $C ${SEP:+--separate-vocab} --out $data
attnkit train --config tatoeba-$DIR --train.max_minutes=${MIN:-60} "$@" --data $data --out runs/$name --quiet --force
echo "train rc $? $(( $(date +%s) - s )) s"
python3 benchmarks/tatoeba.py --run runs/$name --direction $DIR --sets dev  # test only for the run chosen on dev
echo "eval rc $? $(( $(date +%s) - s )) s"
