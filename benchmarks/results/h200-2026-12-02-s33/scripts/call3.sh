#!/usr/bin/env bash
# Session 33, call 3 (branch rowsum-d64-probe: 564581c with rowsum-mma.diff's src re-applied): does the row sum by a
# wgmma shorten D64's two-consumer step, which is softmax-bound (650 clocks against 512 of GEMMs, session 28), where
# d64-3wg's was not? One-tile default vs default-rs at 2K / 4K / 8K, plain and causal, beside the served persistent
# kernel and cuDNN, two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
for pass in 1 2; do
  if [ $pass = 1 ]; then vs=default,default-rs,persistent-tma-q2-de-lpt8; else vs=persistent-tma-q2-de-lpt8,default-rs,default; fi
  echo "== pass $pass $(date +%T)"
  timeout 250 python3 benchmarks/gluon_check.py --phase bench --bench-dims 64 --seqlens 2048,4096,8192 \
    --bench-causal both --variants $vs > $OUT/bench$pass.log 2>&1
  grep -E "^(TIME|ERROR)" $OUT/bench$pass.log | sed 's/  *$//'
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
