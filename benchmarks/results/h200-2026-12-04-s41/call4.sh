#!/usr/bin/env bash
# Session 41 call 4: the D64 backward's dropout mask by fp16 pairs (gluon_dropout.dropout_keep_pairs): the dropout
# tests, then the backward A/B against 9d4d82c's src (bisect/s41/head/src), alternating, four rounds at D64.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
HERE=benchmarks/results/h200-2026-12-04-s41
OLD=$PWD/bisect/s41/head/src NEW=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
PYTHONPATH=$NEW:$PWD/tests timeout 330 python3 -m pytest -v -n 16 -p no:cacheprovider -rfE --tb=short -W ignore \
  tests/test_gluon_bwd.py tests/test_dropout.py -k "dropout or philox" "tests/test_gluon.py::test_dropout_mask_is_exact" \
  > $OUT/tests.log 2>&1; echo "tests rc $?"
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -20; tail -3 $OUT/tests.log
for round in 1 2 3 4; do
  PYTHONPATH=$OLD timeout 150 python3 $HERE/bwd_drop_ab.py old 64 2>&1 | tee -a $OUT/ab.txt
  PYTHONPATH=$NEW timeout 150 python3 $HERE/bwd_drop_ab.py new 64 2>&1 | tee -a $OUT/ab.txt
done
