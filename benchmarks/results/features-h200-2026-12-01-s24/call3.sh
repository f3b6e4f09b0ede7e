#!/usr/bin/env bash
# Session 24, device call 3 (carry bisect/base, bisect/relu, bisect/relu_ds): base = 8ce9853; relu = base with the
# D128 dropout backward's kept P^T clamped and rounded by one cvt.rn.relu per pair (no FMNMX); relu_ds = relu with
# dS^T = max(P^T, 0) (s dP^T) - |P^T| delta (offline: D128 tile loops 990 / 969 -> 958 / 937 -> 936 / 916 SASS,
# spill loads / stores per loop 57 -> 57 -> 68). Alternating A/B of the dropout cost at D128, then the dropout tests
# on relu_ds (the working tree's src).
for c in base relu relu_ds; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 128 \
        --compile-only > "$OUT/compile-$c.txt" 2>&1 &
done
wait
echo "compiled: elapsed $SECONDS s"
for r in 1 2 3; do
    trees="base relu relu_ds"; [ $r = 2 ] && trees="relu_ds relu base"
    for c in $trees; do
        PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 128 2>&1 \
            | tee -a "$OUT/ab.txt"
    done
    echo "pass $r: elapsed $SECONDS s"
done
PYTHONPATH=src timeout $((560 - SECONDS)) python3 -m pytest -q -n 12 --dist worksteal -rfE -p no:cacheprovider \
    tests/test_dropout.py tests/test_gpu.py tests/test_gluon_bwd.py tests/test_gluon.py \
    -k "dropout or philox or dq_conversion" > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -8
