#!/usr/bin/env bash
# Session 27, call 3 (dc9e685: block-relative masks, D64 causal from 512 keys, Q double-buffered persistent grids):
# the README sweep, then the GPU tier part 1.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== sweep $(date +%T)"
timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep.log 2>&1
grep -E "^ *flashtile" $OUT/sweep.log | head -80
echo "== tier part 1 $(date +%T)"
OUT=$OUT/tier1 timeout 390 bash benchmarks/gpu_session.sh tests 1
cp $OUT/tier1/gpu-tier.txt $OUT/tier1.txt 2>/dev/null
cd $OUT && tar czf logs.tgz sweep.log tier1.txt && rm -rf sweep.log tier1.txt tier1 && ls
