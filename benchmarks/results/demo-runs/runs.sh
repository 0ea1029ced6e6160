#!/bin/bash
# Fresh clones of REPO, each set up as the README's first hour says (a virtual environment, then `make demo`), timed,
# one after another, alone on the machine; ZH=1 then also times `attnkit demo --lang zh` in the same clone.
# usage: REPO=/path/to/attnkit OUT=DIR [RUNS="1 2 3"] [ENVS="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ..."]
#        [ZH=1] runs.sh
set -u
out=${OUT:?}; mkdir -p "$out"
timed() {  # NAME COMMAND: run COMMAND in the clone's venv under ENVS, its output in $out/NAME.out, its time in wall.txt
  local s e rc
  s=$(date +%s.%N)
  bash -c "$2" > "$out/$1.out" 2>&1; rc=$?
  e=$(date +%s.%N); echo "$1 rc $rc wall $(echo "$e - $s" | bc) ${ENVS:-native}" >> "$out/wall.txt"
}
for i in ${RUNS:-1 2 3}; do
  rm -rf "/tmp/demo-clone$i"; git clone -q "$REPO" "/tmp/demo-clone$i"
  cd "/tmp/demo-clone$i" || exit 1
  timed "run$i" "python3 -m venv .venv && . .venv/bin/activate && env ${ENVS:-} /usr/bin/time -v make demo"
  cp runs/demo/metrics.csv "$out/run$i-metrics.csv" 2>/dev/null
  if [ -n "${ZH:-}" ]; then
    timed "run$i-zh" ". .venv/bin/activate && env ${ENVS:-} /usr/bin/time -v attnkit demo --lang zh --force --quiet"
    cp runs/demo-zh/metrics.csv "$out/run$i-zh-metrics.csv" 2>/dev/null
  fi
done
