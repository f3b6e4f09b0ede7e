#!/usr/bin/env bash
# Session 29, call 1: the first GPU runs of 769e7d7 (per-warpgroup block ranges, "-wr") and 2ae82d2 (the fused
# split-KV combine, FLASHTILE_DECODE_FUSED_COMBINE=1): their tests, then the -wr A/B, two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== wr tests $(date +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon_3wg.py \
  -k "persistent_matches_reference and wr" > $OUT/wr-tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/wr-tests.txt | head -30; tail -2 $OUT/wr-tests.txt
echo "== fused decode tests $(date +%T)"
FLASHTILE_DECODE_FUSED_COMBINE=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore \
  tests/test_decode.py tests/test_kvcache.py tests/test_kvcache_seqlens.py tests/test_decode_fused_combine.py \
  > $OUT/fused-tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/fused-tests.txt | head -30; tail -2 $OUT/fused-tests.txt
bench() {  # label, causal, seqlens, variants
  echo "== $1 $(date +%T)"
  timeout 100 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims 64 --variants $4 \
    --seqlens $3 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
bench p1-causal 1 1024,2048,4096 persistent-tma-q2-de-lpt8,persistent-3wg-tma-lpt8,persistent-3wg-tma-q2-wr-lpt8
bench p1-plain 0 1024,2048 persistent-tma-q2-de,persistent-3wg-tma-q2,persistent-3wg-tma-q2-wr
bench p2-causal 1 1024,2048,4096 persistent-3wg-tma-q2-wr-lpt8,persistent-3wg-tma-lpt8,persistent-tma-q2-de-lpt8
bench p2-plain 0 1024,2048 persistent-3wg-tma-q2-wr,persistent-3wg-tma-q2,persistent-tma-q2-de
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt
