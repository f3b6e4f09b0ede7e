#!/usr/bin/env bash
# Session 23, device call 5 (carry bisect/cur, bisect/f128): cur = 1bf8d91; f128 = cur with the backward's
# once-per-program dropout scale at D128 too (DROPOUT_ONCE_MAX_HEAD_DIM 128, and dropout_kept_grad's select as inline
# PTX so LLVM cannot rebuild the booleans; offline: D128 tile loops 990 / 969 -> 930 / 910 SASS). Then the Gluon
# backward's dropout tests on f128.
for c in cur f128; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 128 \
        --compile-only > "$OUT/compile-$c.txt" 2>&1 &
done
wait
for r in 1 2 3; do
    for c in cur f128; do
        PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 128 \
            2>&1 | tee -a "$OUT/ab.txt"
    done
done
echo "elapsed $SECONDS s"
PYTHONPATH=bisect/f128/src timeout $((470 - SECONDS)) python3 -m pytest -q -n 12 --dist worksteal -rfE \
    tests/test_gluon_bwd.py tests/test_dropout.py -k "dropout or philox" -p no:cacheprovider > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -15
