#!/bin/bash
# Session 25 call 3: the tiled dQ buffer as the D64 / D128 default. The README sweep (all head dims, cuDNN and FA2 in
# the same run), then the feature costs at D128 8K (gpu_session.sh features). Outputs packed into one tarball.
export PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
git log --oneline -1 2>/dev/null
start=$(date +%s)
python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
    --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep.log 2>&1
echo "sweep $(( $(date +%s) - start )) s"; tail -45 $OUT/sweep.log
OUT=$OUT/feat bash benchmarks/gpu_session.sh features > /dev/null 2>&1
echo "total $(( $(date +%s) - start )) s"; tail -30 $OUT/feat/features.log
cd $OUT && tar czf call3.tgz h200 feat sweep.log && rm -rf h200 feat
