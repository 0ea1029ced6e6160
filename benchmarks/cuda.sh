#!/usr/bin/env bash
# The CUDA checks and GPU timings of docs/speed.md "On a GPU", in one go on a machine with a CUDA GPU, from the
# repository root (the project's requirements installed, or its src/ on PYTHONPATH as here):
#   OUT=DIR bash benchmarks/cuda.sh [RUN]
# 1. the machine: GPU, torch, the CPU's instruction sets -> OUT/env.txt
# 2. tests/test_cuda.py (every CUDA path against the CPU's) -> OUT/tests-cuda.log
# 3. benchmarks/cuda_speed.py: MT training and decoding, attnkit and Hugging Face, peak GPU memory -> OUT/speed.log
# With RUN, a trained Tatoeba zh->en run folder (RUN/data, RUN/checkpoints/avg5.safetensors, RUN/hyp from
# benchmarks/tatoeba.py on the CPU):
# 4. its test set translated on the GPU, greedy and beam 5 (alpha 0.8, the run's choice), timed -> OUT/test.*.txt,
#    and how many lines equal the CPU's outputs;
# 5. the tatoeba-zh-en preset trained on the GPU for 600 updates (bf16 autocast) -> OUT/train-metrics.csv.
# Last, 6. the int8 and linear-kernel tests on this machine's CPU, another CPU than CI's -> OUT/tests-cpu.log
# Every step runs under a time limit and the script goes on after a failure; the exit status counts failures.
set -uo pipefail
OUT=${OUT:-runs/cuda}; RUN=${1:-}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
failed=0
step() {  # NAME SECONDS COMMAND...: output to OUT/NAME.log, wall time appended
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { failed=$((failed + 1)); echo "FAILED ($?)" >> "$OUT/$name.log"; }
    echo "$name: $((SECONDS - start)) s" | tee -a "$OUT/$name.log"
}
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
  lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -wE "avx2|avx512f|avx512_vnni|avx512_bf16|amx_bf16|amx_int8" \
  /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$OUT/env.txt" 2>&1
step tests-cuda 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
step speed 300 python3 benchmarks/cuda_speed.py --json "$OUT/speed.jsonl"
if [ -n "$RUN" ]; then
    ckpt=$RUN/checkpoints/avg5.safetensors
    for search in "greedy --beam 1" "beam5 --beam 5 --lenpen 0.8"; do
        set -- $search
        step "translate-$1" 120 /usr/bin/time -f "%e s wall" python3 -m attnkit translate --checkpoint "$ckpt" \
            --input "$RUN/data/test.src.txt" --output "$OUT/test.$1.txt" --device cuda "${@:2}"
        python3 -c "import sys; a, b = (open(f, encoding='utf-8').read().splitlines() for f in sys.argv[1:])
print(f'lines equal to the CPU outputs: {sum(x == y for x, y in zip(a, b))} of {len(b)}')" \
            "$OUT/test.$1.txt" "$RUN/hyp/test.$1.txt" | tee -a "$OUT/translate-$1.log"
    done
    step train 300 python3 -m attnkit train --config tatoeba-zh-en --data "$RUN/data" --out /tmp/cuda-train --force \
        --quiet --train.device=cuda --train.max_steps=600
    cp /tmp/cuda-train/metrics.csv "$OUT/train-metrics.csv" 2>/dev/null
fi
step tests-cpu 150 python3 -m pytest -q -p no:cacheprovider tests/test_int8.py tests/test_linear.py
echo "failed steps: $failed"
exit "$failed"
