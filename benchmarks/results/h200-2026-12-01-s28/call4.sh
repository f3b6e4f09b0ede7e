#!/usr/bin/env bash
# Session 28, call 4 (219b34f: the deferred epilogue served, D256 plain persistent to 16K): the README sweep, then
# the GPU tier part 2.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== sweep $(date +%T)"
timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep.log 2>&1
grep -E "^ *flashtile" $OUT/sweep.log | head -80
echo "== tier part 2 $(date +%T)"
OUT=$OUT/tier2 timeout 420 bash benchmarks/gpu_session.sh tests 2
cp $OUT/tier2/gpu-tier.txt $OUT/tier2.txt 2>/dev/null
tail -3 $OUT/tier2.txt
cd $OUT && tar czf logs.tgz sweep.log tier2.txt && rm -rf sweep.log tier2.txt tier2 && ls
