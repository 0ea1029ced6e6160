#!/bin/bash
# The fairseq baseline of the Tatoeba recipes (docs/results.md "Tatoeba Chinese-English"): fairseq's `transformer`
# at attnkit's size, on the same machine, data, subwords, references and wall-clock budget, scored the same way.
#
#   [DIR=zh-en|en-zh] [HOURS=1] [VENV=runs/fairseq-venv] benchmarks/fairseq_tatoeba.sh [OUT]
#
# 1. installs fairseq-fixed 0.12.3.1 once into its own virtual environment VENV (not the project's: torch 2.13 is
#    seen from the system's site-packages, everything fairseq adds goes into VENV), from source with --no-deps
#    --no-build-isolation so that its C++ extensions build against torch 2.13 (~3.5 min; torchaudio left out, its
#    wheels are tied to another torch release), as ../shared/bench/PEERS.md did;
# 2. encodes attnkit's prepared folder for the direction (runs/tatoeba-DIR/data, made with the preset's prepare
#    command if missing: the same joint BPE 8k, identity normalisation, the same kept training pairs) into pieces;
# 3. fairseq-preprocess (a joined dictionary, as the shared embeddings need) and fairseq-train --arch transformer
#    with the tatoeba-DIR preset's size and settings (3+3 layers, d 256, 4 heads, FFN 1024, shared embeddings,
#    dropout 0.3 and none on attention and the FFN, label smoothing 0.1, Adam (0.9, 0.98), lr 1e-3 after 800
#    warm-up updates then inverse square root, weight decay 1e-4, clip norm 1, 2,048 tokens a batch) for
#    HOURS of wall time (--stop-time-hours), float32 (fairseq's --bf16 is for accelerators), on the CPU;
# 4. fairseq-generate from checkpoint_best.pt (fairseq's choice, by dev loss) with the decoding length limit attnkit
#    uses (1.2 |x| + 10), the beam-5 length penalty chosen on dev from benchmarks/multi30k.py's grid, greedy and
#    beam 5 on dev and test (timed), detokenised with --remove-bpe sentencepiece;
# 5. scores OUT/hyp/SET.{greedy,beam5}.txt with benchmarks/tatoeba.py --score: sacreBLEU with the target language's
#    tokenizer (zh for Chinese) against the raw references, cased and lowercased, chrF2, signatures:
#    OUT/hyp/results.md and results.json.
# A smoke run: HOURS=0.0167 LENPENS=1.0 benchmarks/fairseq_tatoeba.sh runs/fairseq-smoke
# Another of the run's checkpoints, decoded and scored the same way into OUT/hyp-CKPT without training again:
#   CKPT=checkpoint_last GENERATE_ONLY=1 DIR=en-zh benchmarks/fairseq_tatoeba.sh runs/fairseq-tatoeba-en-zh
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root
DIR=${DIR:-zh-en}; src=${DIR%-*}; tgt=${DIR#*-}
HOURS=${HOURS:-1}
VENV=${VENV:-runs/fairseq-venv}
OUT=${1:-runs/fairseq-tatoeba-$DIR}
CKPT=${CKPT:-checkpoint_best}  # fairseq's own choice (by dev loss); checkpoint_last: the end of the budget
HYP=$OUT/hyp; [ "$CKPT" = checkpoint_best ] || HYP=$OUT/hyp-${CKPT#checkpoint_}  # OUT/hyp, or OUT/hyp-last
LENPENS=${LENPENS:-0.6 0.8 1.0 1.2 1.4}  # benchmarks/multi30k.py's ALPHAS
D=../shared/data/tatoeba-cmn-eng
DATA=${DATA:-runs/tatoeba-$DIR/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
s=$(date +%s)

if [ -z "${GENERATE_ONLY:-}" ]; then
if [ ! -x "$VENV/bin/fairseq-train" ]; then
  python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install wheel cython "hydra-core==1.3.2" "omegaconf==2.3.0" bitarray regex scikit-learn cffi
  "$VENV/bin/pip" install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
fi
"$VENV/bin/python" -c "import fairseq; print('fairseq', fairseq.__version__)" 2>/dev/null

[ -f "$DATA/train.safetensors" ] || attnkit prepare --src "$src" --tgt "$tgt" --train $D/train --valid $D/dev \
  --test $D/test --vocab-size 8000 --normalization identity --character-coverage 1.0 --out "$DATA"
mkdir -p "$OUT/spm" "$OUT/hyp"
python3 - "$DATA" "$OUT/spm" <<'EOF'
import sys
from pathlib import Path

from attnkit.data import load_tokenizers, read_lines

data, out = Path(sys.argv[1]), Path(sys.argv[2])
toks = dict(zip(("src", "tgt"), load_tokenizers(data)))
for split in ("train", "valid", "test"):
    for side, tok in toks.items():
        ids = tok.encode(read_lines(data / f"{split}.{side}.txt"))
        (out / f"{split}.{side}").write_text("".join(" ".join(tok.pieces(seq)) + "\n" for seq in ids), encoding="utf-8")
EOF
joined=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['settings']['joint'])" "$DATA/prepare.json")
if [ "$joined" != True ]; then echo "fairseq_tatoeba.sh: $DATA has separate vocabularies; this baseline shares them"; exit 2; fi
rm -rf "$OUT/bin"
"$VENV/bin/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$OUT/spm/train" \
  --validpref "$OUT/spm/valid" --testpref "$OUT/spm/test" --destdir "$OUT/bin" --joined-dictionary --workers 2 \
  > "$OUT/preprocess.log" 2>&1
echo "preprocessed $(( $(date +%s) - s )) s"

rm -rf "$OUT/checkpoints"
"$VENV/bin/fairseq-train" "$OUT/bin" --arch transformer --cpu --seed 1 --num-workers 0 \
  --encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 \
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.3 --attention-dropout 0.0 --activation-dropout 0.0 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.0001 --clip-norm 1.0 \
  --lr 0.001 --lr-scheduler inverse_sqrt --warmup-updates 800 --warmup-init-lr 1e-07 \
  --max-tokens 2048 --max-epoch 200 --stop-time-hours "$HOURS" \
  --save-dir "$OUT/checkpoints" --keep-last-epochs 5 --log-format simple --log-interval 100 --no-progress-bar \
  > "$OUT/train.log" 2>&1
echo "trained $(( $(date +%s) - s )) s: $(grep -c 'end of epoch' "$OUT/train.log") epochs"
fi
mkdir -p "$HYP"

generate() {  # SUBSET BEAM LENPEN OUTFILE: detokenised hypotheses in input order; prints the seconds it took
  local t0; t0=$(date +%s.%N)
  # fairseq 0.12 pickles argparse.Namespace into its checkpoints, which torch >= 2.6 refuses to load by default;
  # this file is the one fairseq-train wrote above
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$VENV/bin/fairseq-generate" "$OUT/bin" --path "$OUT/checkpoints/$CKPT.pt" --cpu --gen-subset "$1" \
    --beam "$2" --lenpen "$3" --max-len-a 1.2 --max-len-b 10 --batch-size 128 --remove-bpe sentencepiece \
    --required-batch-size-multiple 1 2> /dev/null | grep '^D-' | sed 's/^D-//' | sort -n -k1,1 | cut -f3 > "$4"
  # (with its default multiple of 8, fairseq-generate silently leaves out the longest sentences past the last
  # multiple: 3 of the 1,003 test sentences)
  if [ "$(wc -l < "$4")" != "$(wc -l < "$OUT/spm/$1.src")" ]; then
    echo "fairseq_tatoeba.sh: $4 has $(wc -l < "$4") lines for $(wc -l < "$OUT/spm/$1.src") sources" >&2; exit 1
  fi
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)"
}
dev_bleu() { attnkit evaluate --hyp "$1" --ref $D/dev.$tgt.gz --tgt-lang "$tgt" | head -1 | cut -d' ' -f2; }

best=""; best_bleu=-1
for a in $LENPENS; do  # the length penalty, on dev only
  generate valid 5 "$a" "$HYP/dev.beam5.lenpen$a.txt" > /dev/null
  b=$(dev_bleu "$HYP/dev.beam5.lenpen$a.txt")
  echo "dev beam-5 BLEU at lenpen $a: $b"
  if python3 -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$b" "$best_bleu"; then
    best=$a; best_bleu=$b
  fi
done
echo "lenpen $best (chosen on dev)" | tee "$HYP/lenpen.txt"
for set in dev test; do
  subset=$([ $set = dev ] && echo valid || echo test)
  echo "$set greedy: $(generate $subset 1 1.0 "$HYP/$set.greedy.txt") s, beam 5: $(generate $subset 5 "$best" \
    "$HYP/$set.beam5.txt") s" | tee -a "$HYP/decode-times.txt"
done
python3 benchmarks/tatoeba.py --score "$HYP" --direction "$DIR"
echo "done $(( $(date +%s) - s )) s"
