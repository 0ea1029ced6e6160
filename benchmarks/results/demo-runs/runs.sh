#!/bin/bash
# three fresh clones: make demo (en), then attnkit demo --lang zh, each timed
# usage: REPO=/path/to/attnkit [OUT=/tmp/demoruns] runs.sh   (each run alone on the machine: nothing else running)
out=${OUT:-/tmp/demoruns}
for i in 1 2 3; do
  rm -rf /tmp/demo$i; git clone -q "$REPO" /tmp/demo$i
  cd /tmp/demo$i
  s=$(date +%s.%N)
  /usr/bin/time -v make demo > $out/run$i.out 2>&1; rc=$?
  e=$(date +%s.%N); echo "run $i rc $rc wall $(echo "$e - $s" | bc)" >> $out/wall.txt
  cp runs/demo/metrics.csv $out/run$i-metrics.csv 2>/dev/null
  s=$(date +%s.%N)
  /usr/bin/time -v python3 -m attnkit demo --lang zh --force > $out/zh-run$i.out 2>&1; rc=$?
  e=$(date +%s.%N); echo "zh run $i rc $rc wall $(echo "$e - $s" | bc)" >> $out/wall.txt
  ls runs > $out/zh-run$i.ls
  cp runs/demo-zh/metrics.csv $out/zh-run$i-metrics.csv 2>/dev/null
done
cd "$REPO" && python3 -m pip install --quiet --disable-pip-version-check -e . > $out/reinstall.out 2>&1
echo done >> $out/wall.txt
