#!/usr/bin/env bash
# Session 24, device call 5: the feature-cost bench again on the same tree as call 4 (warm machine, cached kernels).
OUT="$OUT" timeout 300 bash benchmarks/gpu_session.sh features > /dev/null 2>&1; echo "rc $? elapsed $SECONDS s"
grep -A6 "^feature cost" "$OUT/features.log"
