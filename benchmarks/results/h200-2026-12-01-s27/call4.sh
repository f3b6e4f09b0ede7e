#!/usr/bin/env bash
# Session 27, call 4: the GPU tier part 2, beside the 54 part-1 tests call 3's 390 s cap cut (4 workers).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
mkdir -p $OUT/rest1
(timeout 400 python3 -m pytest -v -p no:cacheprovider -n 4 -rfE --tb=short -W ignore $(cat benchmarks/results/h200-2026-12-01-s27/rest1.txt | tr '\n' ' ') \
  > $OUT/rest1.txt 2>&1) &
OUT=$OUT/tier2 bash benchmarks/gpu_session.sh tests 2
wait
grep -E "^(FAILED|ERROR)" $OUT/rest1.txt | head; tail -1 $OUT/rest1.txt
cp $OUT/tier2/gpu-tier.txt $OUT/tier2.txt; rm -rf $OUT/tier2 $OUT/rest1
