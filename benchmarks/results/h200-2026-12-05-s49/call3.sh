#!/usr/bin/env bash
# Session 49 call 3: the dropout factor test as corrected after call 1 (compiled dQ/dK differ from the select form in
# the last bits) and the varlen batches without tokens; the select-vs-factor timing (benchmarks/dropout_factor_ab.py);
# then GPU fuzz from seed 906 (session 46 reached 906 in the dense/varlen family), as far as 140 s go.
set -uo pipefail
mkdir -p $OUT
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_dropout.py tests/test_varlen.py -k "factor or without or all_padding" > $OUT/factor-test.txt 2>&1; tail -3 $OUT/factor-test.txt
timeout 120 python3 benchmarks/dropout_factor_ab.py 2>&1 | tee $OUT/dropout_factor_ab.txt
FLASHTILE_FUZZ_FIRST=906 FLASHTILE_FUZZ_CASES=150 timeout -k 5 140 python3 -m pytest -q -p no:cacheprovider -n 16 \
    -rfE --tb=short tests/test_fuzz.py > $OUT/fuzz.txt 2>&1; tail -5 $OUT/fuzz.txt
