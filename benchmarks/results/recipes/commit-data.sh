# Sourced by before-after.sh, step-ci.sh, dtype-auto-check.sh and amx-path-rss/run.sh: a preset's data prepared from ../shared/data, a
# worktree of one commit with that data prepared by the commit's own code (the prepared format changed at #42), and
# the verb that trains the preset. Run from the repository root.
prepare_data() {  # OUT PRESET ATTNKIT...: PRESET's data in OUT, prepared by the command ATTNKIT... (e.g. attnkit)
    local out=$1 preset=$2 data; shift 2; data=$(cd ../shared/data && pwd)
    case "$preset" in
        multi30k|rnn-*) "$@" prepare --src de --tgt en --train "$data/multi30k/train" --valid "$data/multi30k/val" \
                      --test "$data/multi30k/test_2016_flickr" --vocab-size 8000 --out "$out" > /dev/null ;;
        lm-word-wt2) "$@" lm prepare --train "$data/wikitext-2/wiki.train.tokens.gz" \
                      --valid "$data/wikitext-2/wiki.valid.tokens.gz" --level word --out "$out" > /dev/null ;;
        tatoeba-zh-en|tatoeba-en-zh) local dir=${preset#tatoeba-}
                      "$@" prepare --src "${dir%-*}" --tgt "${dir#*-}" --train "$data/tatoeba-cmn-eng/train" \
                      --valid "$data/tatoeba-cmn-eng/dev" --test "$data/tatoeba-cmn-eng/test" --vocab-size 8000 \
                      --out "$out" > /dev/null ;;
        *) echo "preset $preset: multi30k (or an rnn-* preset, on its data), lm-word-wt2, tatoeba-zh-en or" \
                "tatoeba-en-zh" >&2; return 2 ;;
    esac
}
worktree_with_data() {  # DIR REV PRESET: a worktree of REV at DIR, its data in DIR/data from ../shared/data
    local wt=$1
    rm -rf "$wt"; git worktree prune; git worktree add -f --detach "$wt" "$2" > /dev/null 2>&1
    prepare_data "$wt/data" "$3" env PYTHONPATH="$PWD/$wt/src" python3 -m attnkit
}
train_verb() {  # PRESET: the attnkit verb that trains it ("lm train" for the language models)
    case "$1" in lm-*) echo "lm train" ;; *) echo train ;; esac
}
step_and_peak() {  # METRICS STEPS: the mean step over updates 50 to STEPS (ms) and the run's peak RSS (MiB)
    python3 - "$1" "$2" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["split"] == "train"]
t = {int(r["step"]): float(r["elapsed_s"]) for r in rows}
last = int(sys.argv[2])
peak = max(float(r.get("peak_rss_mb") or r["rss_mb"]) for r in rows)  # older commits log the resident set only
print(f"{1e3 * (t[last] - t[50]) / (last - 50):.1f} {peak:.0f}")
PY
}
