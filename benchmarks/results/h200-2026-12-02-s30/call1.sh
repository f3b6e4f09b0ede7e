#!/usr/bin/env bash
# Session 30, call 1: the -lr GPU cases added after session 29's device time, then the 188 tier tests session 29's
# call 6 did not reach (one id list, -lr first in the log's order is not guaranteed with -n 16: -v names each).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
mapfile -t ids < <(grep -v '^[[:space:]]*$' bisect/s30/call1_ids.txt)
timeout -k 5 540 python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  "${ids[@]}" > $OUT/call1.txt 2>&1
grep -E "^(FAILED|ERROR)" $OUT/call1.txt | head -30; tail -2 $OUT/call1.txt
cd $OUT && gzip call1.txt && ls
