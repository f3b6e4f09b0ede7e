#!/usr/bin/env bash
# Session 24, device call 6 (carry bisect/base2, bisect/epi): base2 = c9ff933; epi = base2 with the one-tile forward's
# O through shared memory (O_VIA_SMEM) for every dense two-consumer launch at D128 / D256, features included (was:
# plain and causal only). Alternating A/B of the D128 feature costs, then the forward's feature tests on epi.
feats="softcap:30 alibi bias dropout:0.1"
for c in base2 epi; do
    for f in $feats; do
        PYTHONPATH=bisect/$c/src timeout 300 python3 benchmarks/feature_ab.py $c $f --head-dims 128 --compile-only \
            > "$OUT/compile-$c-$f.txt" 2>&1 &
    done
done
wait
echo "compiled: elapsed $SECONDS s"
for r in 1 2; do
    trees="base2 epi"; [ $r = 2 ] && trees="epi base2"
    for f in $feats; do
        for c in $trees; do
            PYTHONPATH=bisect/$c/src timeout 100 python3 benchmarks/feature_ab.py $c $f --head-dims 128 2>&1 \
                | grep -v "flashtile from" | tee -a "$OUT/ab.txt"
        done
    done
    echo "pass $r: elapsed $SECONDS s"
done
PYTHONPATH=bisect/epi/src timeout $((570 - SECONDS)) python3 -m pytest -q -n 12 --dist worksteal -rfE \
    -p no:cacheprovider tests/test_gluon.py tests/test_gluon_alibi_split.py \
    -k "features_match or dropout_matches or dropout_mask or bias_matches or o_via or bias_rows or features_backward or alibi" \
    > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -8
