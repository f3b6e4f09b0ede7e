#!/usr/bin/env bash
# Session 23, device call 2 (carry bisect/c1, bisect/keys): c1 = fa33ff0 (7 rounds; D64's backward scales once),
# keys = c1 with the Philox key (seed halves) passed through a non-pure inline-asm mov per call, so the round keys
# are recomputed per tile instead of hoisted and spilled (offline: D128 backward tile loops 1031 -> 990 SASS, spill
# loads / stores 153 -> 57). Then the dropout GPU tests on the keys tree.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for c in c1 keys; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 64,128 \
        --compile-only > "$OUT/compile-$c.txt" 2>&1 &
done
wait
for r in 1 2; do
    for c in c1 keys; do
        PYTHONPATH=bisect/$c/src timeout 200 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 64,128 \
            2>&1 | tee -a "$OUT/ab.txt"
    done
done
echo "elapsed $SECONDS s"
PYTHONPATH=bisect/keys/src timeout $((590 - SECONDS)) python3 -m pytest -q tests/test_gluon_bwd.py tests/test_gluon.py \
    tests/test_dropout.py tests/test_gpu.py -k "dropout or philox" 2>&1 | tail -15 | tee "$OUT/tests.txt"
