#!/usr/bin/env bash
# Session 36 call 6: the fixed launch-count test (block-table bounds read once) with its file, then the D64 causal 2K
# ncu pair of call 5 again, its files packed in one archive (call 5's came back only as the printed summary).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
mkdir -p $OUT/ncu
timeout 120 python3 -m pytest -q -n 16 -p no:cacheprovider -rfE --tb=short -W ignore tests/test_kvcache_seqlens.py \
  tests/test_kvcache.py > $OUT/tests.log 2>&1; echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -2 $OUT/tests.log
for case in gluon-persistent-3wg-tma-lpt8-64-2048-causal gluon-persistent-tma-q2-de-lpt8-64-2048-causal; do
  echo "== $case $(date +%T)"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section InstructionStats \
    --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -k "regex:_attn_fwd_hopper" --launch-skip 1 --launch-count 1 -o $OUT/rep \
    python3 benchmarks/ncu_cases.py $case > $OUT/ncu/ncu-$case.log 2>&1
  timeout 30 ncu --import $OUT/rep.ncu-rep --print-summary none > $OUT/ncu/ncu-$case.txt 2>&1
  timeout 60 ncu --import $OUT/rep.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > $OUT/ncu/sass-$case.csv.gz
  grep -E "Duration|inst_executed.sum" $OUT/ncu/ncu-$case.txt | sed 's/  */ /g'
  python3 benchmarks/ncu_source_stalls.py $OUT/ncu/sass-$case.csv.gz --top 12 > $OUT/ncu/stalls-$case.txt 2>&1
  rm -f $OUT/rep.ncu-rep
done
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu && ls
