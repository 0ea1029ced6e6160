# Sourced by before-after.sh and step-ci.sh: a worktree of one commit with the preset's data prepared by that commit's
# own code (the prepared format changed at #42), and the verb that trains the preset. Run from the repository root.
worktree_with_data() {  # DIR REV PRESET: a worktree of REV at DIR, its data in DIR/data from ../shared/data
    local wt=$1 data; data=$(cd ../shared/data && pwd)
    rm -rf "$wt"; git worktree prune; git worktree add -f --detach "$wt" "$2" > /dev/null 2>&1
    local attnkit=(env PYTHONPATH="$PWD/$wt/src" python3 -m attnkit)
    case "$3" in
        multi30k) "${attnkit[@]}" prepare --src de --tgt en --train "$data/multi30k/train" \
                      --valid "$data/multi30k/val" --test "$data/multi30k/test_2016_flickr" --vocab-size 8000 \
                      --out "$wt/data" > /dev/null ;;
        lm-word-wt2) "${attnkit[@]}" lm prepare --train "$data/wikitext-2/wiki.train.tokens.gz" \
                      --valid "$data/wikitext-2/wiki.valid.tokens.gz" --level word --out "$wt/data" > /dev/null ;;
        *) echo "preset $3: multi30k or lm-word-wt2" >&2; return 2 ;;
    esac
}
train_verb() {  # PRESET: the attnkit verb that trains it ("lm train" for the language models)
    case "$1" in lm-*) echo "lm train" ;; *) echo train ;; esac
}
