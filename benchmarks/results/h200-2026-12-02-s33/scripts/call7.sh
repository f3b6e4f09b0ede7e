#!/usr/bin/env bash
# Session 33, call 7: P by pairs served in the three-consumer D64 kernels (d64-3wg, persistent-3wg-tma*): the GPU
# tests of the three-consumer and D64 paths, then the README sweep's D64 rows again.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
echo "== tests $(date +%T)"
timeout -k 5 330 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  tests/test_gluon_3wg.py tests/test_gluon.py tests/test_gpu.py tests/test_varlen.py tests/test_gluon_alibi_split.py \
  -k "3wg or d64 or 64" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -1 $OUT/tests.txt
echo "== sweep d64 $(date +%T)"
timeout 200 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --head-dims 64 --seqlens 512,1k,2k,4k,8k,16k --out $OUT/sweep-d64 > $OUT/sweep.log 2>&1
tail -1 $OUT/sweep.log
echo "== end $(date +%T)"
cd $OUT && gzip tests.txt && tar czf logs.tgz sweep.log && rm -f sweep.log
