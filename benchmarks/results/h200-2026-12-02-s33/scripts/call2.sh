#!/usr/bin/env bash
# Session 33, call 2 (f388dfa; no served kernel changed since sessions 28-32's sweeps): the README sweep, twice, for a
# table from one run and the run-to-run spread beside it.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
for run in 1 2; do
  echo "== sweep $run $(date +%T)"
  timeout 280 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
    --seqlens 512,1k,2k,4k,8k,16k --out $OUT/sweep$run > $OUT/sweep$run.log 2>&1
  tail -2 $OUT/sweep$run.log
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz sweep1.log sweep2.log && rm -f sweep1.log sweep2.log && ls -R | head -20
