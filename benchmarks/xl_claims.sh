#!/usr/bin/env bash
# The Transformer-XL claims of docs/claims.md on one corpus, one after another, each timed (wall, peak RSS) into
# runs/xl-CORPUS/logs/; each experiment's .md table is what benchmarks/results/claims/ keeps. xl-table6 trains the
# six models, recl reuses them, planted-recall trains its four.
#   bash benchmarks/xl_claims.sh ts    # tiny-shakespeare, 3,000 updates (~2 h on 2 cores)
#   bash benchmarks/xl_claims.sh wt2   # wikitext-2, 6,000 updates (~3.5 h)
#   bash benchmarks/xl_claims.sh wt2 xl-table6 recl   # only those experiments, in that order
#   UPDATES=3000 bash benchmarks/xl_claims.sh wt2 planted-recall   # another number of updates
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:?ts or wt2}" in
    ts) data=tiny-shakespeare; updates=${UPDATES:-3000}; tokens=2048 ;;
    wt2) data=wikitext-2; updates=${UPDATES:-6000}; tokens=4096 ;;
    *) echo "usage: $0 ts|wt2" >&2; exit 2 ;;
esac
out=runs/xl-$1; logs=$out/logs; mkdir -p "$logs"
run() {  # NAME ARGS...: one experiment, its output and /usr/bin/time's figures in NAME.log
    local name=$1; shift
    /usr/bin/time -v -o "$logs/$name.time" python3 -m attnkit experiment "$@" > "$logs/$name.log" 2>&1
    grep -E "Elapsed|Maximum resident" "$logs/$name.time" >> "$logs/$name.log"; rm "$logs/$name.time"
}
corpus=$1; shift
[ $# -gt 0 ] || set -- xl-table6 recl planted-recall
for experiment in "$@"; do
    case $experiment in
        xl-table6|planted-recall)
            run "$experiment-$corpus" "$experiment" --data "$data" --out "$out" --updates "$updates" ;;
        recl) run "recl-$corpus" recl --data "$data" --out "$out" --updates "$updates" --tokens "$tokens" ;;
        *) echo "unknown experiment $experiment: xl-table6, recl or planted-recall" >&2; exit 2 ;;
    esac
done
