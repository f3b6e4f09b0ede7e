#!/usr/bin/env bash
# Session 29, call 2: the fused split-KV combine (2ae82d2) against the two-kernel path: the per-kernel profile and
# the decode bench with CUDA graphs, each with and without FLASHTILE_DECODE_FUSED_COMBINE=1; then the 174 tier-part-1
# tests session 28's call 5 did not reach.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for fused in 0 1; do
  echo "== profile fused=$fused $(date +%T)"
  FLASHTILE_DECODE_FUSED_COMBINE=$fused timeout 90 python3 benchmarks/decode_profile.py --cache-lens 4096,16384,131072 \
    --decode-batch 8,64 2>&1 | tee $OUT/profile-$fused.log
done
for fused in 0 1; do
  echo "== decode bench fused=$fused $(date +%T)"
  FLASHTILE_DECODE_FUSED_COMBINE=$fused timeout 120 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa \
    --cuda-graphs --max-seconds 90 --no-plots --out $OUT/decode-$fused > $OUT/decode-$fused.log 2>&1
  grep -vE "^\s*$" $OUT/decode-$fused.log | tail -30
done
echo "== tier rest $(date +%T)"
OUT=$OUT/tier timeout 250 bash benchmarks/gpu_session.sh tests ids benchmarks/results/h200-2026-12-01-s28/call5-rest1.txt
cp $OUT/tier/gpu-tier.txt $OUT/tier-rest.txt 2>/dev/null
cd $OUT && tar czf logs.tgz *.log *.txt decode-0 decode-1 && rm -rf *.txt tier decode-0 decode-1 && ls
