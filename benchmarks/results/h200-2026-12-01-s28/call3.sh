#!/usr/bin/env bash
# Session 28, call 3: the persistent grid at long rows (where the one-tile kernel serves): D128 plain 8K / 16K
# (default / persistent-tma-q2 / -de), D64 plain 8K / 16K (d64-3wg / persistent-3wg-tma-q2), D256 plain 4K-16K
# (default / persistent), D128 causal 8K / 16K (sched4 / q2-sched4 / q2-de-sched4); two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
bench() {  # label, causal, dims, variants, seqlens
  echo "== $1 $(date +%T)"
  timeout 150 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims $3 --variants $4 \
    --seqlens $5 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
bench p1-d128 0 128 default,persistent-tma-q2,persistent-tma-q2-de 8192,16384
bench p1-d64 0 64 d64-3wg,persistent-3wg-tma-q2 8192,16384
bench p1-d256 0 256 default,persistent 4096,8192,16384
bench p1-d128c 1 128 persistent-tma-sched4,persistent-tma-q2-sched4,persistent-tma-q2-de-sched4 8192,16384
bench p2-d128 0 128 persistent-tma-q2-de,persistent-tma-q2,default 8192,16384
bench p2-d64 0 64 persistent-3wg-tma-q2,d64-3wg 8192,16384
bench p2-d256 0 256 persistent,default 4096,8192,16384
bench p2-d128c 1 128 persistent-tma-q2-de-sched4,persistent-tma-q2-sched4,persistent-tma-sched4 8192,16384
