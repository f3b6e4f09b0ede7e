#!/usr/bin/env bash
# Session 43 call 1: the random cross-checks with their final bound (tests/test_fuzz.py: dense / varlen and, for the
# first time on the H200, flash_attn_with_kvcache cases), seeds 0-299, 16 workers, stopped at 400 s; then
# tests/test_features.py (its fp32 softcap tests run session 42's fp32 tanh, kernels/common._tanh), stopped at 150 s.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
git log -1 --format=%h 2>/dev/null | tee $OUT/commit.txt
FLASHTILE_FUZZ_CASES=300 timeout -k 5 400 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore tests/test_fuzz.py > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR|XPASS)" $OUT/fuzz.txt || true; } | head -60; tail -3 $OUT/fuzz.txt
grep -c PASSED $OUT/fuzz.txt
timeout -k 5 150 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
    tests/test_features.py > $OUT/features.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/features.txt || true; } | head -40; tail -3 $OUT/features.txt
