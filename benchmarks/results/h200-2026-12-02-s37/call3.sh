#!/usr/bin/env bash
# Session 37 call 3 (main with the decode plans for appends, ALiBi and cache_leftpad): the README's two decode
# tables again: graph replays (all batches / lengths / page sizes) and eager steps.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 250 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --cuda-graphs --max-seconds 200 \
  --no-plots --out $OUT/graphs > $OUT/graphs.log 2>&1; echo "graphs rc $?"; grep "^decode" $OUT/graphs.log | grep -v skipped
timeout 200 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --decode-batch 8,64 \
  --cache-lens 4k,16k --page-size 0,16,256 --no-plots --out $OUT/eager > $OUT/eager.log 2>&1; echo "eager rc $?"
grep "^decode" $OUT/eager.log | grep -v skipped
