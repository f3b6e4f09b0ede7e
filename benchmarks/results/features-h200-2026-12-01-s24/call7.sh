#!/usr/bin/env bash
# Session 24, device call 7 (carry bisect/base2, bisect/final): base2 = c9ff933 (register stores for feature
# launches); final = e5852ab (O through shared memory for them, 269209e's rule). Windows and sinks, which the rule
# includes and call 6 did not time: one alternating A/B at D128 8K.
for c in base2 final; do
    for f in sink window:1024:0; do
        PYTHONPATH=bisect/$c/src timeout 150 python3 benchmarks/feature_ab.py $c $f --head-dims 128 --compile-only \
            > /dev/null 2>&1 &
    done
done
wait
echo "compiled: elapsed $SECONDS s"
for r in 1 2; do
    trees="base2 final"; [ $r = 2 ] && trees="final base2"
    for f in sink window:1024:0; do
        for c in $trees; do
            PYTHONPATH=bisect/$c/src timeout 60 python3 benchmarks/feature_ab.py $c $f --head-dims 128 2>&1 \
                | grep -v "flashtile from" | tee -a "$OUT/ab.txt"
        done
    done
    echo "pass $r: elapsed $SECONDS s"
done
