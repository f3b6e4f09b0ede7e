#!/usr/bin/env bash
# Session 42 call 4: the GPU tier's part 2 (tests/test_fuzz.py's 24 GPU cases among its files) after the fuzz's
# bound took the stored lse's error too, beside call 3's fp32 cases with tf32x3 dots again (stopped at 300 s).
set -uo pipefail
export PYTHONUNBUFFERED=1
HERE=benchmarks/results/h200-2026-12-04-s42
mkdir -p $OUT
(PYTHONPATH=$PWD/src:$PWD/tests timeout 300 python3 $HERE/fp32_dots.py tf32x3 0 400 > $OUT/fp32-tf32x3.txt 2>&1) &
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
wait
sort -rn -k2 $OUT/fp32-tf32x3.txt | head -8; wc -l $OUT/fp32-tf32x3.txt
