#!/usr/bin/env bash
# Session 36 call 5 (main + the block-table bounds cache): the KV-cache / varlen / plans tests, eager decode host time
# and bench (contiguous, 16- and 256-token pages), then ncu of D64 causal 2K's two forwards (3wg vs two consumers).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
mkdir -p $OUT/ncu
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider -rfE --tb=short -W ignore tests/test_kvcache.py \
  tests/test_varlen.py tests/test_kvcache_seqlens.py tests/test_decode.py tests/test_plans.py > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -2 $OUT/tests.log
timeout 100 python3 benchmarks/host_time.py --decode $OUT/decode-profile.txt 2>&1 | tee $OUT/host.txt
timeout 150 python3 -m flashtile.bench --modes decode --providers flashtile,sdpa --decode-batch 8,64 \
  --cache-lens 4k,16k --page-size 0,16,256 --no-plots --out $OUT/decode > $OUT/decode.log 2>&1; tail -32 $OUT/decode.log
for case in gluon-persistent-3wg-tma-lpt8-64-2048-causal gluon-persistent-tma-q2-de-lpt8-64-2048-causal; do
  echo "== $case $(date +%T)"
  timeout 90 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section InstructionStats \
    --metrics "smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -k "regex:_attn_fwd_hopper" --launch-skip 1 --launch-count 1 -o $OUT/rep \
    python3 benchmarks/ncu_cases.py $case > $OUT/ncu/ncu-$case.log 2>&1
  timeout 30 ncu --import $OUT/rep.ncu-rep --print-summary none > $OUT/ncu/ncu-$case.txt 2>&1
  timeout 60 ncu --import $OUT/rep.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > $OUT/ncu/sass-$case.csv.gz
  grep -E "Duration|Issue Slots Busy|inst_executed.sum|stalled_(barrier|long_scoreboard|wait|math_pipe_throttle|mio_throttle|short_scoreboard|dispatch_stall|no_instruction|selected)_per" $OUT/ncu/ncu-$case.txt | sed 's/  */ /g'
  python3 benchmarks/ncu_source_stalls.py $OUT/ncu/sass-$case.csv.gz --top 12 > $OUT/ncu/stalls-$case.txt 2>&1; head -24 $OUT/ncu/stalls-$case.txt
  rm -f $OUT/rep.ncu-rep
done
