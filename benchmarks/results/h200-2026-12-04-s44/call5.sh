#!/usr/bin/env bash
# Session 44 call 5: the fp32 cases of the random cross-checks' dense / varlen and programmable families, seeds
# 0-299, after the design slack took the backward's lse rounding (calls 1 / 4 failed seeds 246, 269, 294 on it).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
FLASHTILE_FUZZ_CASES=300 timeout -k 5 400 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore tests/test_fuzz.py -k "float32 and not kvcache" > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR|XPASS)|^E   AssertionError" $OUT/fuzz.txt || true; } | head -40; tail -3 $OUT/fuzz.txt
