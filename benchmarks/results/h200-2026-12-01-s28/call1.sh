#!/usr/bin/env bash
# Session 28, call 1: the deferred epilogue ("-q2-de" variants, 62892f2): its GPU tests, then the A/B against the
# q2 twins in one process, two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests $(date +%T)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py tests/test_gluon_3wg.py \
  -k "persistent_matches_reference and de" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -2 $OUT/tests.txt
bench() {  # label, causal, dims, variants
  echo "== $1 $(date +%T)"
  timeout 150 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims $3 --variants $4 \
    --seqlens 512,1024,2048,4096 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
bench p1-d64-full 0 64 persistent-tma-q2,persistent-tma-q2-de,persistent-3wg-tma-q2,persistent-3wg-tma-q2-de
bench p1-d64-causal 1 64 persistent-tma-q2-lpt8,persistent-tma-q2-de-lpt8
bench p1-d128-full 0 128 persistent-tma-q2,persistent-tma-q2-de
bench p1-d128-causal 1 128 persistent-tma-sched4,persistent-tma-q2-sched4,persistent-tma-q2-de-sched4
bench p2-d64-full 0 64 persistent-3wg-tma-q2-de,persistent-3wg-tma-q2,persistent-tma-q2-de,persistent-tma-q2
bench p2-d64-causal 1 64 persistent-tma-q2-de-lpt8,persistent-tma-q2-lpt8
bench p2-d128-full 0 128 persistent-tma-q2-de,persistent-tma-q2
bench p2-d128-causal 1 128 persistent-tma-q2-de-sched4,persistent-tma-q2-sched4,persistent-tma-sched4
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt
