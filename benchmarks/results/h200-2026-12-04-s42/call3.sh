#!/usr/bin/env bash
# Session 42 call 3: the fuzz's fp32 cases among seeds 0-399 with tf32x3 dots (what runs) and FMA dots, side by side
# (two processes); call 1's three failures (seeds 23, 177, 246) are among them.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
HERE=benchmarks/results/h200-2026-12-04-s42
mkdir -p $OUT
for p in tf32x3 ieee; do
  timeout 200 python3 $HERE/fp32_dots.py $p 0 400 > $OUT/fp32-$p.txt 2>&1 &
done
wait
sort -rn -k2 $OUT/fp32-tf32x3.txt | head -12; sort -rn -k2 $OUT/fp32-ieee.txt | head -12
wc -l $OUT/fp32-*.txt
