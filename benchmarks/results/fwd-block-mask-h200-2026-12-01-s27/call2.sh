#!/usr/bin/env bash
# Session 27, call 2: Q double-buffered in the persistent forward (GluonConfig.q_buffers=2, "-q2" variants): its
# tests, then the variants against their single-buffered twins in one process, two passes in swapped order.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests $(date +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py tests/test_gluon_3wg.py \
  -k "persistent_matches_reference and q2" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -2 $OUT/tests.txt
bench() {  # label, causal, dims, variants
  echo "== $1 $(date +%T)"
  timeout 170 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims $3 --variants $4 \
    --seqlens 512,1024,2048,4096 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
bench p1-d64-full 0 64 persistent-tma,persistent-tma-q2,persistent-3wg-tma,persistent-3wg-tma-q2
bench p1-d64-causal 1 64 persistent-tma-lpt8,persistent-tma-q2-lpt8
bench p1-d128-full 0 128 persistent-tma,persistent-tma-q2
bench p1-d128-causal 1 128 persistent-tma-sched4,persistent-tma-q2-sched4
bench p2-d64-full 0 64 persistent-3wg-tma-q2,persistent-3wg-tma,persistent-tma-q2,persistent-tma
bench p2-d64-causal 1 64 persistent-tma-q2-lpt8,persistent-tma-lpt8
bench p2-d128-full 0 128 persistent-tma-q2,persistent-tma
bench p2-d128-causal 1 128 persistent-tma-q2-sched4,persistent-tma-sched4
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt
