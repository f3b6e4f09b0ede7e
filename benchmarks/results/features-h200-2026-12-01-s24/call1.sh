#!/usr/bin/env bash
# Session 24, device call 1 (carry bisect/base, bisect/new, bisect/new256): base = 096e8d5; new = base with the bias
# tiles' bf16 -> fp32 by bit moves (forward and backward), the backward's bias-alone scores as two FFMAs, and the
# forward's dropout compare + select as one inline-PTX block per pair; new256 = new without fresh round keys in the
# D256 forward (FRESH_KEYS_FWD_MIN_HEAD_DIM 512). Alternating A/Bs of the feature cost, time with / without.
for c in base new; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c attn_bias=bench --compile-only \
        > "$OUT/compile-bias-$c.txt" 2>&1 &
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --compile-only \
        > "$OUT/compile-dropout-$c.txt" 2>&1 &
done
for c in new new256; do
    PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 256 \
        --compile-only > "$OUT/compile-d256-$c.txt" 2>&1 &
done
wait
echo "compiled: elapsed $SECONDS s"
tail -n 3 "$OUT"/compile-*.txt | grep -i "error\|Traceback" && exit 1
for r in 1 2; do
    trees="base new"; [ $r = 2 ] && trees="new base"
    for c in $trees; do
        PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c attn_bias=bench 2>&1 | tee -a "$OUT/ab.txt"
    done
    for c in $trees; do
        PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c dropout_p=0.1 2>&1 | tee -a "$OUT/ab.txt"
    done
    trees="new new256"; [ $r = 2 ] && trees="new256 new"
    for c in $trees; do
        PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c dropout_p=0.1 --head-dims 256 2>&1 \
            | tee -a "$OUT/ab.txt"
    done
    echo "pass $r: elapsed $SECONDS s"
done
