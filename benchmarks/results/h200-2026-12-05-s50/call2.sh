#!/usr/bin/env bash
# Session 50 call 2 (7b4a282): the fuzz on the H200, seeds 1000-1099 of each family.
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
mkdir -p $OUT
start=$SECONDS
FLASHTILE_FUZZ_FIRST=1000 FLASHTILE_FUZZ_CASES=100 timeout -k 5 400 python3 -m pytest -p no:cacheprovider -n 16 \
    --dist worksteal -rfE --tb=short -W ignore -q tests/test_fuzz.py > $OUT/fuzz.txt 2>&1
echo "fuzz rc=$? $((SECONDS - start)) s"; tail -3 $OUT/fuzz.txt; grep -E "^(FAILED|ERROR)" $OUT/fuzz.txt | head -30 || true
