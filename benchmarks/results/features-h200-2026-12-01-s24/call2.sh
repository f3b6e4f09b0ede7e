#!/usr/bin/env bash
# Session 24, device call 2: the GPU tests of the bias and dropout paths on the working tree of call 1's "new" (the
# same kernels as its bisect/new).
PYTHONPATH=src timeout 520 python3 -m pytest -q -n 12 --dist worksteal -rfE -p no:cacheprovider tests/test_gluon.py \
    tests/test_gluon_bwd.py tests/test_dropout.py tests/test_gpu.py tests/test_features.py tests/test_attention.py \
    tests/test_gluon_3wg.py -k "bias or dropout or philox" > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -15
