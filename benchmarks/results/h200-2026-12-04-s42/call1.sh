#!/usr/bin/env bash
# Session 42 call 1: the random cross-check (tests/test_fuzz.py, tests/fuzz_cases.py) on the H200: seeds 0-299, GPU
# cases (bf16 / fp16 / fp32, head dims 64 / 128 / 256 and others, up to 2^24 scores, every feature combination),
# 16 workers, stopped at 480 s (-v streams each result, so a stop still says what ran).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
FLASHTILE_FUZZ_CASES=300 timeout -k 5 480 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore tests/test_fuzz.py > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/fuzz.txt || true; } | head -60; tail -3 $OUT/fuzz.txt
grep -c PASSED $OUT/fuzz.txt
