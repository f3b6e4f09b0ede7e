#!/bin/bash
# Session 22, call 1: the persistent dK/dV branch's first GPU run, then where the default backward stalls.
# run: bash benchmarks/results/persistent-bwd-h200-2026-12-01-s22/call1.sh   (repo root, $OUT set)
export PYTHONPATH=src:benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
echo "== tests"
timeout 240 python3 -m pytest -q -x tests/test_gluon_bwd.py tests/test_gluon_bwd_persistent_protocol.py -k persistent \
    > "$OUT/tests.log" 2>&1; echo "rc $?"; tail -5 "$OUT/tests.log"
if grep -q " passed" "$OUT/tests.log" && ! grep -q "failed\|error" "$OUT/tests.log"; then
    echo "== A/B"
    timeout 300 python3 benchmarks/gluon_bwd_check.py --variants default,persistent --check-dims 128 --bench-dims 128 \
        --seqlens 1024,2048,4096,8192,16384 --skip-features > "$OUT/ab.log" 2>&1; echo "rc $?"
    grep -E "^(FAIL|ERROR|TIME)" "$OUT/ab.log" | head -20; grep -E "TFLOP|ratio|INFO bench" "$OUT/ab.log" | tail -40
fi
echo "== ncu source counters, default dK/dV, D128 8K"
timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    -k "regex:_attn_bwd_dkdv_hopper" --launch-skip 1 --launch-count 1 -o "$OUT/bwd" \
    python3 benchmarks/ncu_cases.py bwd-128-8192-full > "$OUT/ncu.log" 2>&1; echo "rc $?"; tail -3 "$OUT/ncu.log"
ncu --import "$OUT/bwd.ncu-rep" --page source --print-source sass --csv > "$OUT/bwd-sass.csv" 2> "$OUT/sass.err"
echo "sass rc $? lines $(wc -l < "$OUT/bwd-sass.csv")"; head -c 600 "$OUT/bwd-sass.csv"; head -3 "$OUT/sass.err"
ncu --import "$OUT/bwd.ncu-rep" --page details > "$OUT/bwd-details.txt" 2>&1
gzip -f "$OUT/bwd-sass.csv"
