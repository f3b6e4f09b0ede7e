#!/usr/bin/env bash
# Session 45 call 3: the random cross-checks past seed 300 on the H200 for the first time: seeds 300-599 of all
# families (dense / varlen, KV cache, programmable), 16 workers, stopped at 520 s; library of 323dd13.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
FLASHTILE_FUZZ_FIRST=300 FLASHTILE_FUZZ_CASES=300 timeout -k 5 520 python3 -m pytest -v -p no:cacheprovider -n 16 \
    --dist worksteal -rfE --tb=short -W ignore --durations=15 tests/test_fuzz.py > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR|XPASS)" $OUT/fuzz.txt || true; } | head -60; tail -22 $OUT/fuzz.txt
grep -c PASSED $OUT/fuzz.txt
gzip $OUT/fuzz.txt
