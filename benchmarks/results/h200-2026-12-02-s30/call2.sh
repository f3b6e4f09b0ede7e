#!/usr/bin/env bash
# Session 30, call 2: the split-KV kernel's full key blocks by TMA (FLASHTILE_DECODE_TMA): the decode / KV-cache tests
# with it on, then the per-kernel profile alternated off / on / off / on, then the decode tiles with it on.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests TMA=1 $(date +%T)"
FLASHTILE_DECODE_TMA=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore \
  tests/test_decode.py tests/test_kvcache.py tests/test_kvcache_seqlens.py > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head; tail -1 $OUT/tests.txt
for t in 0 1 0 1; do
  echo "== profile TMA=$t $(date +%T)"
  FLASHTILE_DECODE_TMA=$t timeout 80 python3 benchmarks/decode_profile.py --cache-lens 4096,16384,131072 \
    --decode-batch 8,64 2>&1 | grep -v -i "warn" | tee -a $OUT/profile-$t.log
done
echo "== tiles TMA=1 $(date +%T)"
FLASHTILE_DECODE_TMA=1 timeout 120 python3 benchmarks/decode_tiles.py --page-sizes 0 \
  --variants cur,128x4x3x2,64x4x4x2,128x8x3x2,64x4x2x2,64x4x3x1 2>&1 | tee $OUT/tiles-tma.log
echo "== end $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt && ls
