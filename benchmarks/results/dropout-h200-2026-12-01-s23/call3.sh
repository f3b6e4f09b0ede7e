#!/usr/bin/env bash
# Session 23, device call 3: the dropout GPU tests on the final tree (7 rounds; D64's backward scales once; round
# keys recomputed per tile in the Gluon backward and in the forward above D64).
n=""; python3 -c "import xdist" 2>/dev/null && n="-n 12 --dist worksteal"
echo "xdist: ${n:-none}"
PYTHONPATH=src timeout 560 python3 -m pytest -q $n -rfE tests/test_dropout.py tests/test_gpu.py tests/test_gluon_bwd.py \
    tests/test_gluon.py -k "dropout or philox" > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
tail -25 "$OUT/tests.txt"
