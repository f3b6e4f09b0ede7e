#!/usr/bin/env bash
# Session 37 call 4: D64 causal 1K / 2K / 4K forward (16K tokens), the served persistent-tma-q2-de-lpt8 against the
# other causal orders of the same kernel (lpt4 / lpt16 / sched4 / sched8, none measured with q2-de before) and its
# lazy-rescale twin; cuDNN beside. Two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
bench() {  # label, variants, time limit
  echo "== $1 $(date +%T)"
  timeout $3 python3 benchmarks/gluon_check.py --phase bench --bench-causal 1 --bench-dims 64 --variants $2 \
    --seqlens 1024,2048,4096 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
V=persistent-tma-q2-de-lpt8,persistent-tma-q2-de-lpt4,persistent-tma-q2-de-lpt16,persistent-tma-q2-de-sched4,persistent-tma-q2-de-sched8,persistent-tma-q2-de-lpt8-lr
bench p1 $V 150
bench p2 $(echo $V | tr , '\n' | tac | paste -sd,) 90
