#!/usr/bin/env bash
# Session 29: the lazy rescale ("-lr", GluonConfig.lazy_rescale) against the served persistent variants, one pass.
# bash lr_ab.sh LABEL ORDER (ORDER "base-first" or "lr-first": each pair's order within the process).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
label=$1; order=$2
bench() {  # name, causal, dims, seqlens, base variants...
  local name=$1 causal=$2 dims=$3 seqlens=$4; shift 4
  local vs=""
  for b in "$@"; do
    if [ "$order" = lr-first ]; then vs="$vs,$b-lr,$b"; else vs="$vs,$b,$b-lr"; fi
  done
  echo "== $label $name $(date +%T)"
  timeout 90 python3 benchmarks/gluon_check.py --phase bench --bench-causal $causal --bench-dims $dims \
    --variants ${vs#,} --seqlens $seqlens 2>&1 | grep -E "TIME|ERROR|Error" | tee -a $OUT/lr-$label.log
}
bench d128-plain 0 128 1024,4096,16384 persistent-tma-q2
bench d128-causal-short 1 128 1024,2048,4096 persistent-tma-q2-de-sched4
bench d128-causal-long 1 128 8192,16384 persistent-tma-sched4
bench d64-plain-short 0 64 512,1024 persistent-tma-q2-de
bench d64-plain-long 0 64 2048,8192 persistent-3wg-tma-q2
bench d64-causal 1 64 1024,2048,4096 persistent-tma-q2-de-lpt8
bench d256-plain 0 256 1024,4096,16384 persistent
bench d256-causal 1 256 1024,4096,16384 persistent-sched4
