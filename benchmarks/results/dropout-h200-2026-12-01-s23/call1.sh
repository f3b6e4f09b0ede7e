#!/usr/bin/env bash
# Session 23, device call 1 (carry bisect/r10, bisect/r7, bisect/fold): the dropout A/B. Trees: r10 = ac417d4 (10
# Philox rounds), r7 = 7 rounds, fold = 7 rounds + the Gluon backward's 1 / (1 - p) applied once per program.
# Two passes, trees alternating; each line: time with dropout 0.1 / without, same process.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
# Compile the three trees side by side first (triton's cache is keyed by source), then time them one at a time.
for c in r10 r7 fold; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 64,128 \
        --compile-only > "$OUT/compile-$c.txt" 2>&1 &
done
wait
tail -3 "$OUT"/compile-*.txt
for r in 1 2; do
    for c in r10 r7 fold; do
        PYTHONPATH=bisect/$c/src timeout 200 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 64,128 \
            2>&1 | tee -a "$OUT/ab.txt"
    done
done
# The fold tree's Gluon dropout backward against the reference, while time is left
echo "elapsed $SECONDS s"
if [ $SECONDS -lt 420 ]; then
    PYTHONPATH=bisect/fold/src timeout $((560 - SECONDS)) python3 -m pytest -q -x tests/test_gluon_bwd.py -k dropout \
        2>&1 | tail -15 | tee "$OUT/tests.txt"
fi
