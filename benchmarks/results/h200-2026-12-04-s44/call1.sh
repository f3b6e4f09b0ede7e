#!/usr/bin/env bash
# Session 44 call 1: the random cross-checks at session 43's final rule and draws (tests/test_fuzz.py's dense /
# varlen family and, for the first time on the H200, the programmable family: flashtile.attention), seeds 0-299,
# 16 workers, stopped at 540 s.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
git log -1 --format=%h 2>/dev/null | tee $OUT/commit.txt
FLASHTILE_FUZZ_CASES=300 timeout -k 5 540 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore --durations=15 tests/test_fuzz.py -k "not kvcache" > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR|XPASS)" $OUT/fuzz.txt || true; } | head -60; tail -22 $OUT/fuzz.txt
grep -c PASSED $OUT/fuzz.txt
