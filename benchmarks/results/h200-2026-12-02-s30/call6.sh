#!/usr/bin/env bash
# Session 30, call 6: ncu of the two-consumer persistent forward with and without the lazy rescale (why it loses
# there): D64 1K plain (persistent-tma-q2-de, the served kernel) and D128 4K plain (persistent-tma-q2).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
for case in gluon-persistent-tma-q2-de-64-1024-full gluon-persistent-tma-q2-de-lr-64-1024-full \
            gluon-persistent-tma-q2-128-4096-full gluon-persistent-tma-q2-lr-128-4096-full; do
  echo "== $case $(date +%T)"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section InstructionStats \
    --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -k "regex:_attn_fwd_hopper_persistent" --launch-skip 1 --launch-count 1 -o $OUT/rep \
    python3 benchmarks/ncu_cases.py $case > $OUT/ncu-$case.log 2>&1
  ncu --import $OUT/rep.ncu-rep --print-summary none > $OUT/ncu-$case.txt 2>&1
  ncu --import $OUT/rep.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > $OUT/sass-$case.csv.gz
  grep -E "Duration|Issue Slots Busy|inst_executed.sum|stalled_(barrier|long_scoreboard|wait|math_pipe_throttle|mio_throttle|short_scoreboard|dispatch_stall|no_instruction|branch_resolving|selected)_per" $OUT/ncu-$case.txt | sed 's/  */ /g'
  python3 benchmarks/ncu_source_stalls.py $OUT/sass-$case.csv.gz --top 12 > $OUT/stalls-$case.txt 2>&1; head -30 $OUT/stalls-$case.txt
  rm -f $OUT/rep.ncu-rep
done
cd $OUT && tar czf ncu.tgz *.txt *.log *.csv.gz && rm -f *.txt *.log *.csv.gz && ls
