#!/usr/bin/env bash
# Session 51 call 1 (the tree of the commit that fixes the Gluon forward's -inf sink): session 50's -inf sink probe
# again (head 0's output must equal the call without a sink, nothing NaN), then part 1 of the GPU test tier (the Gluon
# forward's files, whose sink cases now turn head 0's sink off, and the bias test with a -inf sink).
set -uo pipefail
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout -k 5 120 python3 benchmarks/results/h200-2026-12-05-s50/sink_minus_inf_probe.py > $OUT/sink_probe.txt 2>&1
echo "probe rc=$?"; cut -c1-300 $OUT/sink_probe.txt
start=$SECONDS
OUT=$OUT/tier1 bash benchmarks/gpu_session.sh tests 1
echo "tier part 1: $((SECONDS - start)) s"
