#!/usr/bin/env bash
# Session 46 call 4 (run as one command line; library of 507f54c): the random cross-checks from seed 800, all three
# families, 16 workers, stopped at 270 s (the session's device budget).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
FLASHTILE_FUZZ_FIRST=800 FLASHTILE_FUZZ_CASES=300 timeout -k 5 270 python3 -m pytest -v -p no:cacheprovider -n 16 \
    --dist worksteal -rfE --tb=short -W ignore tests/test_fuzz.py > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/fuzz.txt || true; } | head -30; tail -3 $OUT/fuzz.txt; grep -c PASSED $OUT/fuzz.txt
gzip $OUT/fuzz.txt
