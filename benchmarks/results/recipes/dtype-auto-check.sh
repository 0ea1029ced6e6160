#!/bin/bash
# Is `train.dtype: auto` right on this machine? Per preset that says auto: the probe's choice and ratio (train.log of a
# 1-update run), then the steps themselves, float32 and bfloat16 fixed, 160 updates each, taking turns: ms/update over
# updates 50-100 (before any evaluation). Data is prepared once under runs/dtype-check. Run alone, from anywhere.
# usage: [ROUNDS=1] dtype-auto-check.sh [PRESET ...]   (default: the presets that say auto)
cd "$(dirname "$0")/../../.."  # the repository root
. benchmarks/results/recipes/commit-data.sh  # prepare_data, train_verb
R=runs/dtype-check; mkdir -p $R
data_of() { case $1 in tatoeba-*) echo $1 ;; lm-*) echo lm-word-wt2 ;; *) echo multi30k ;; esac; }  # its data's preset
presets=${*:-multi30k rnn-bahdanau kyubyong-small tatoeba-zh-en tatoeba-en-zh lm-word-wt2 lm-word-wt2-lstm}
for d in $(for p in $presets; do data_of $p; done | sort -u); do
  [ -d $R/$d ] || prepare_data $R/$d $d attnkit || exit 2
done
echo "$(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
for p in $presets; do
  attnkit $(train_verb $p) --config $p --data $R/$(data_of $p) --out $R/probe-$p --train.max_steps=1 --quiet \
    --force > /dev/null 2>&1
  echo "$p: $(grep -ho 'train.dtype auto: .*' $R/probe-$p/train.log | tail -1)"
done
for round in $(seq ${ROUNDS:-1}); do
  for p in $presets; do
    for dt in float32 bfloat16; do
      out=$R/ab-$p-$dt-$round
      attnkit $(train_verb $p) --config $p --data $R/$(data_of $p) --out $out --train.max_steps=160 --train.dtype=$dt \
        --quiet --force > /dev/null 2>&1
      python3 -c "import csv, sys; e = {int(r['step']): float(r['elapsed_s']) for r in csv.DictReader(open(sys.argv[1]))
if r['split'] == 'train'}; print(sys.argv[2], f'{(e[100] - e[50]) * 20:.1f} ms/update')" $out/metrics.csv "$p $dt $round"
    done
  done
done
