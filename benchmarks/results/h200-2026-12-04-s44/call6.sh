#!/usr/bin/env bash
# Session 44 call 6: after the portable kernels took a score_mod's scores through one fma (kernels/common._exp2_minus):
# the programmable family's fp32 cases of seeds 0-299 (seeds 269 / 294 failed in call 5), then the files that run
# score mods (tests/test_programmable.py, the Gluon block-sparse files), stopped at 100 s each.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
FLASHTILE_FUZZ_CASES=300 timeout -k 5 100 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE \
    --tb=short -W ignore tests/test_fuzz.py -k "programmable and float32" > $OUT/fuzz.txt 2>&1
{ grep -E "^(FAILED|ERROR)|^E   AssertionError" $OUT/fuzz.txt || true; } | head -20; tail -1 $OUT/fuzz.txt
timeout -k 5 100 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
    tests/test_programmable.py tests/test_gluon_sparse.py tests/test_gluon_sparse_bwd.py > $OUT/mods.txt 2>&1
{ grep -E "^(FAILED|ERROR)" $OUT/mods.txt || true; } | head -20; tail -1 $OUT/mods.txt
