#!/usr/bin/env bash
# Session 21, call 1: the D256 backward re-measure, the fp32 tile A/B, then tier part 1 until the call's end.
set -uo pipefail
start=$(date +%s)
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for r in 1 2; do
  python3 -m flashtile.bench --modes bwd --head-dims 256 --seqlens 1k,2k,4k --causal both \
    --providers flashtile,sdpa-cudnn --max-seqlen-probe 0 --no-plots --out "$OUT/d256bwd-r$r" > "$OUT/d256bwd-r$r.log" 2>&1
  grep -E "flashtile|cudnn" "$OUT/d256bwd-r$r.log" | tail -14
done
echo "== d256 done at $(( $(date +%s) - start )) s"
timeout 240 python3 benchmarks/fp32_tiles.py --out "$OUT/fp32" 2>&1 | tee "$OUT/fp32.log" | grep -v Warning
echo "== fp32 done at $(( $(date +%s) - start )) s"
left=$(( 560 - ($(date +%s) - start) ))
part1="tests/test_gluon.py tests/test_gluon_3wg.py tests/test_gluon_persistent_protocol.py
    tests/test_gluon_sparse.py tests/test_varlen.py tests/test_fast_launch.py tests/test_plans.py
    tests/test_dropout.py tests/test_persistent_schedule.py tests/test_gluon_grid_order.py
    tests/test_features.py tests/test_programmable.py"
mkdir -p "$OUT/part1"
timeout -k 5 $left python3 -m pytest -v -p no:cacheprovider -n 16 --dist worksteal -rfE --tb=short -W ignore \
  $part1 -k "not flex_mods_match and not kernels_compile" > "$OUT/part1/gpu-tier.txt" 2>&1
{ grep -E "^(FAILED|ERROR)" "$OUT/part1/gpu-tier.txt" || true; } | head -40; tail -3 "$OUT/part1/gpu-tier.txt"
echo "== end at $(( $(date +%s) - start )) s"
