#!/bin/bash
# Session 26 call 4: the GPU tier part 1 (the forward's files, with the three-consumer persistent kernel's tests and
# the O-by-TMA fix's shape), then the README sweep.
export PYTHONPATH=src
mkdir -p $OUT/c4
OUT=$OUT/c4 bash benchmarks/gpu_session.sh tests 1
timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --seqlens 512,1k,2k,4k,8k,16k --out $OUT/c4/h200 > $OUT/c4/bench.log 2>&1; tail -50 $OUT/c4/bench.log
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
