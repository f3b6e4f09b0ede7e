#!/usr/bin/env bash
# Session 43 call 5, at the fuzz's packed draws (the library as at 6f5c652; cpu.py's score scaling does not run here):
# the GPU draws among seeds 0-299 that go through the kv- / qkv-packed entry points, stopped at 170 s.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
FLASHTILE_FUZZ_CASES=300 timeout -k 5 170 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore tests/test_fuzz.py -k "test_fuzz[ and packed" > $OUT/fuzz-packed.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/fuzz-packed.txt || true; } | head -40; tail -2 $OUT/fuzz-packed.txt
