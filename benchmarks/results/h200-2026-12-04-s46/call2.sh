#!/usr/bin/env bash
# Session 46 call 2 (library of 1681232): the batch-fast bias order's A/B (bias_order.py, capped at 180 s), fuzz seed
# 771 (session 45's |scale| fix, not yet on the H200), then the GPU tier's part 2.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
mkdir -p $OUT
echo 1681232 > $OUT/commit.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout -k 5 180 python3 benchmarks/results/h200-2026-12-04-s46/bias_order.py 2>&1 | tee $OUT/bias_order.txt
FLASHTILE_FUZZ_FIRST=771 FLASHTILE_FUZZ_CASES=1 timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -rfE \
    --tb=short -W ignore tests/test_fuzz.py -k "triton" > $OUT/seed771.txt 2>&1
tail -2 $OUT/seed771.txt
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
