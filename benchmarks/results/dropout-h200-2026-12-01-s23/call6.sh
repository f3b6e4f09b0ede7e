#!/usr/bin/env bash
# Session 23, device call 6: call 3's dropout tests again on the final tree (after the review's renames and the
# dQ-scale test), with xdist.
PYTHONPATH=src timeout 300 python3 -m pytest -q -n 12 --dist worksteal -rfE -p no:cacheprovider tests/test_dropout.py \
    tests/test_gpu.py tests/test_gluon_bwd.py tests/test_gluon.py -k "dropout or philox or dq_conversion" \
    > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -8
