#!/usr/bin/env bash
# Session 29, call 4: the lazy rescale's A/B pass 2 where pass 1 had it ahead (D256, the D64 three-consumer rows):
# each "-lr" twin before its base now, with more lengths.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
bench() {  # name, causal, dims, seqlens, variants
  echo "== p2 $1 $(date +%T)"
  timeout 120 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims $3 --variants $5 \
    --seqlens $4 2>&1 | grep -E "TIME|ERROR|Error" | tee -a $OUT/lr-p2.log
}
bench d256-plain 0 256 1024,2048,4096,8192,16384 persistent-lr,persistent
bench d256-causal 1 256 1024,2048,4096,8192,16384 persistent-sched4-lr,persistent-sched4
bench d64-plain-long 0 64 2048,4096,8192 persistent-3wg-tma-q2-lr,persistent-3wg-tma-q2
bench d64-plain-16k 0 64 16384 persistent-3wg-tma-q2-lr,persistent-3wg-tma-q2,d64-3wg
