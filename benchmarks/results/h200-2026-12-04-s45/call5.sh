#!/usr/bin/env bash
# Session 45 call 5: fuzz seed 771 (fp32, one-key rows, negative softmax scale) with the slack's |scale| (e761ef9).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
FLASHTILE_FUZZ_FIRST=771 FLASHTILE_FUZZ_CASES=1 timeout -k 5 70 python3 -m pytest -q -p no:cacheprovider -rfE \
    --tb=short -W ignore tests/test_fuzz.py -k "test_fuzz and triton and not kvcache and not programmable" \
    > $OUT/seed771.txt 2>&1
tail -5 $OUT/seed771.txt
