#!/bin/bash
# Fresh clones of REPO, each set up as the README's first hour says (a virtual environment, then `make demo`), timed,
# one after another, alone on the machine.
# usage: REPO=/path/to/attnkit OUT=DIR [RUNS="1 2 3"] [ENVS="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ..."] runs.sh
set -u
out=${OUT:?}; mkdir -p "$out"
for i in ${RUNS:-1 2 3}; do
  rm -rf /tmp/demo-clone$i; git clone -q "$REPO" /tmp/demo-clone$i
  cd /tmp/demo-clone$i
  s=$(date +%s.%N)
  bash -c "python3 -m venv .venv && . .venv/bin/activate && env ${ENVS:-} /usr/bin/time -v make demo" > "$out/run$i.out" 2>&1; rc=$?
  e=$(date +%s.%N); echo "run $i rc $rc wall $(echo "$e - $s" | bc) ${ENVS:-native}" >> "$out/wall.txt"
  cp runs/demo/metrics.csv "$out/run$i-metrics.csv" 2>/dev/null
done
