#!/usr/bin/env bash
# Session 24, device call 4, the final tree (main after the relu commit): the dropout GPU tests (call 3's run had
# failed on fp16: two return statements in dropout_kept_p), then the feature-cost bench (gpu_session.sh features).
PYTHONPATH=src timeout 250 python3 -m pytest -q -n 12 --dist worksteal -rfE -p no:cacheprovider \
    tests/test_dropout.py tests/test_gpu.py tests/test_gluon_bwd.py tests/test_gluon.py \
    -k "dropout or philox or dq_conversion" > "$OUT/tests.txt" 2>&1
echo "rc $? elapsed $SECONDS s"
grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.txt" | tail -5
OUT="$OUT" timeout $((570 - SECONDS)) bash benchmarks/gpu_session.sh features > /dev/null 2>&1
echo "features rc $? elapsed $SECONDS s"
tail -30 "$OUT/features.log"
