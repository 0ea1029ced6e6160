#!/bin/bash
# A language-model recipe probe: `attnkit lm train --config CONFIG` plus overrides on a budget, then the validation
# split scored as the recipes are (never test: the probe chosen on valid is scored on test once, by hand).
# usage: [CORPUS=ts|wt2] [MIN=20|60] bash benchmarks/probe_lm.sh NAME CONFIG [--model.FIELD=VALUE --train.FIELD=VALUE ...]
#   ts: Tiny Shakespeare, characters, 20 minutes (the LSTM recipe's 1.4245 nats to beat); wt2: WikiText-2, words,
#   60 minutes. The output, /usr/bin/time's wall and peak RSS go to runs/NAME.log, the run's
#   metrics and log beside it; the run itself to runs/NAME.
cd "$(dirname "$0")/.."  # the repository root
name=${1:?NAME}; config=${2:?CONFIG}; shift 2
logs=runs
case ${CORPUS:-ts} in
  ts) data=runs/shakespeare/data; min=${MIN:-20}
      [ -f $data/corpus.safetensors ] || attnkit lm prepare --train ../shared/data/tiny_shakespeare/input.txt.gz \
        --valid-fraction 0.1 --level char --out $data ;;
  wt2) data=runs/wt2/data; min=${MIN:-60}; W=../shared/data/wikitext-2
      [ -f $data/corpus.safetensors ] || attnkit lm prepare --train $W/wiki.train.tokens.gz \
        --valid $W/wiki.valid.tokens.gz --test $W/wiki.test.tokens.gz --level word --out $data ;;
  *) echo "CORPUS: ts or wt2" >&2; exit 2 ;;
esac
{
  echo "# $config $* (${CORPUS:-ts}, $min min)"
  /usr/bin/time -f "train wall %e s, peak RSS %M KB" attnkit lm train --config "$config" --data $data \
    --out runs/$name --quiet --force --train.max_minutes=$min "$@"
  attnkit lm eval --checkpoint runs/$name/checkpoints/best.safetensors --data $data --split valid
} > $logs/$name.log 2>&1
cp runs/$name/metrics.csv $logs/$name.metrics.csv
cp runs/$name/train.log $logs/$name.train.log
tail -2 $logs/$name.log
