#!/usr/bin/env bash
# Session 28, call 2: the half-width last key block ("-half", GluonConfig.half_last): its GPU tests (with the served
# q2-de orders), then A/B against the q2-de twins in one process, two passes in swapped order; D128 causal 8K / 16K
# (sched4 against q2-de-sched4 and its -half twin) for the range q2-de-sched4 serves.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests $(date +%T)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 16 -rfE --tb=short -W ignore tests/test_gluon.py \
  -k "persistent_matches_reference and (half or q2-de-lpt8 or q2-de-sched4)" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.txt | head -30; tail -2 $OUT/tests.txt
bench() {  # label, causal, dims, variants, seqlens
  echo "== $1 $(date +%T)"
  timeout 150 python3 benchmarks/gluon_check.py --phase bench --bench-causal $2 --bench-dims $3 --variants $4 \
    --seqlens $5 2>&1 | grep -E "TIME|ERROR" | tee -a $OUT/bench.log
}
S=512,1024,2048,4096
bench p1-d64-causal 1 64 persistent-tma-q2-de-lpt8,persistent-tma-q2-de-half-lpt8 $S
bench p1-d128-causal 1 128 persistent-tma-q2-de-sched4,persistent-tma-q2-de-half-sched4 $S
bench p1-d128-causal-long 1 128 persistent-tma-sched4,persistent-tma-q2-de-sched4,persistent-tma-q2-de-half-sched4 8192,16384
bench p2-d64-causal 1 64 persistent-tma-q2-de-half-lpt8,persistent-tma-q2-de-lpt8 $S
bench p2-d128-causal 1 128 persistent-tma-q2-de-half-sched4,persistent-tma-q2-de-sched4 $S
bench p2-d128-causal-long 1 128 persistent-tma-q2-de-half-sched4,persistent-tma-q2-de-sched4,persistent-tma-sched4 8192,16384
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.txt
