#!/bin/bash
# Is `train.dtype: auto` right on this machine? Per preset that says auto: the probe's choice and ratio (train.log of a
# 1-update run), then the steps themselves, float32 and bfloat16 fixed, 160 updates each, taking turns: ms/update over
# updates 50-100 (before any evaluation). Data is prepared once under runs/dtype-check. Run alone, from anywhere.
# usage: [ROUNDS=1] dtype-auto-check.sh [PRESET ...]   (default: the presets that say auto)
cd "$(dirname "$0")/../../.."  # the repository root
D=$(cd ../shared/data && pwd); R=runs/dtype-check; mkdir -p $R
[ -d $R/m30k ] || attnkit prepare --src de --tgt en --train $D/multi30k/train --valid $D/multi30k/val \
  --test $D/multi30k/test_2016_flickr --vocab-size 8000 --out $R/m30k > /dev/null
[ -d $R/wt2 ] || attnkit lm prepare --train $D/wikitext-2/wiki.train.tokens.gz \
  --valid $D/wikitext-2/wiki.valid.tokens.gz --level word --out $R/wt2 > /dev/null
for dir in zh-en en-zh; do
  [ -d $R/tatoeba-$dir ] || attnkit prepare --src ${dir%-*} --tgt ${dir#*-} --train $D/tatoeba-cmn-eng/train \
    --valid $D/tatoeba-cmn-eng/dev --test $D/tatoeba-cmn-eng/test --vocab-size 8000 --out $R/tatoeba-$dir > /dev/null
done
data_of() { case $1 in tatoeba-*) echo $R/$1 ;; lm-*) echo $R/wt2 ;; *) echo $R/m30k ;; esac; }
verb_of() { case $1 in lm-*) echo "lm train" ;; *) echo train ;; esac; }
presets=${*:-multi30k rnn-bahdanau kyubyong-small tatoeba-zh-en tatoeba-en-zh lm-word-wt2 lm-word-wt2-lstm}
echo "$(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
for p in $presets; do
  attnkit $(verb_of $p) --config $p --data $(data_of $p) --out $R/probe-$p --train.max_steps=1 --quiet --force > /dev/null 2>&1
  echo "$p: $(grep -ho 'train.dtype auto: .*' $R/probe-$p/train.log | tail -1)"
done
for round in $(seq ${ROUNDS:-1}); do
  for p in $presets; do
    for dt in float32 bfloat16; do
      out=$R/ab-$p-$dt-$round
      attnkit $(verb_of $p) --config $p --data $(data_of $p) --out $out --train.max_steps=160 --train.dtype=$dt \
        --quiet --force > /dev/null 2>&1
      python3 -c "import csv, sys; e = {int(r['step']): float(r['elapsed_s']) for r in csv.DictReader(open(sys.argv[1]))
if r['split'] == 'train'}; print(sys.argv[2], f'{(e[100] - e[50]) * 20:.1f} ms/update')" $out/metrics.csv "$p $dt $round"
    done
  done
done
