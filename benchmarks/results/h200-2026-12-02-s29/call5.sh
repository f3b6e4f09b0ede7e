#!/usr/bin/env bash
# Session 29, call 5 (after the "-lr" variants were served at D256 and D64 plain 1025-16384 keys): the README sweep at
# D64 / D256 (the rows whose kernels changed), then the GPU tier's part 2 (pytest with its own limit).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
part1_files="tests/test_gluon.py tests/test_gluon_3wg.py tests/test_gluon_persistent_protocol.py
    tests/test_gluon_sparse.py tests/test_varlen.py tests/test_fast_launch.py tests/test_plans.py
    tests/test_dropout.py tests/test_persistent_schedule.py tests/test_gluon_grid_order.py
    tests/test_features.py tests/test_programmable.py tests/test_bench.py tests/test_gluon_alibi_split.py"
echo "== sweep $(date +%T)"
timeout 130 python3 -m flashtile.bench --providers flashtile,sdpa-cudnn,sdpa-flash --max-seqlen-probe 0 \
  --head-dims 64,256 --seqlens 512,1k,2k,4k,8k,16k --out $OUT/h200 > $OUT/sweep.log 2>&1
grep -E "^ *flashtile" $OUT/sweep.log | head -60
echo "== part 2 $(date +%T)"
# shellcheck disable=SC2046
timeout -k 5 420 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  -k "not flex_mods_match and not kernels_compile" tests/ $(for f in $part1_files; do printf -- '--ignore=%s ' "$f"; done) \
  > $OUT/tier2.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tier2.txt | head -20; tail -1 $OUT/tier2.txt
echo "== done $(date +%T)"
cd $OUT && tar czf logs.tgz *.log *.txt h200 && rm -f tier2.txt && ls
