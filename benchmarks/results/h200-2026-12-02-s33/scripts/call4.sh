#!/usr/bin/env bash
# Session 33, call 4 (564581c; the decode kernels unchanged since session 13's table, re-timed since only by
# decode_profile.py): the README's decode sweep again, and the per-kernel profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== profile $(date +%T)"
timeout 150 python3 benchmarks/decode_profile.py > $OUT/decode-profile.txt 2>&1; tail -25 $OUT/decode-profile.txt
echo "== sweep $(date +%T)"
timeout 300 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --cuda-graphs \
  --max-seconds 130 --no-plots --out $OUT/decode > $OUT/decode.log 2>&1
grep -v "it/s\|run/s" $OUT/decode.log | tail -40
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "== end $(date +%T)"
