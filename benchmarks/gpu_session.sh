#!/usr/bin/env bash
# One device call per phase (each fits the 10-minute limit), output under $OUT. From the repo root:
#   bash benchmarks/gpu_session.sh tests      # the GPU test tier (~4 min with 8 workers)
#   bash benchmarks/gpu_session.sh bench      # the default sweep, all providers (~6 min)
#   bash benchmarks/gpu_session.sh features   # feature cost and window scaling at head dim 128 (~2 min)
#   bash benchmarks/gpu_session.sh tune [ARGS]  # tile sweep, e.g. tune --head-dims 256 --seqlen 4096
#   bash benchmarks/gpu_session.sh sparse     # block-sparse vs dense flashtile vs FlexAttention, 16K tokens
set -euo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
phase="${1:-tests}"
shift || true
case "$phase" in
    tests)
        python3 -m pytest -q -p no:cacheprovider -n 8 tests/ "$@" 2>&1 | tee "$OUT/gpu-tier.txt" | tail -15 ;;
    bench)
        python3 -m flashtile.bench --out "$OUT/h200" "$@" > "$OUT/bench.log" 2>&1; tail -60 "$OUT/bench.log" ;;
    features)
        python3 -m flashtile.bench --head-dims 128 --seqlens 8k,16k --causal both --max-seqlen-probe 0 \
            --providers flashtile,flex,sdpa-cudnn --feature none --feature window:256:0 --feature window:1024:0 \
            --feature window:4096:0 --feature softcap:30 --feature alibi --out "$OUT/features" "$@" \
            > "$OUT/features.log" 2>&1; tail -60 "$OUT/features.log" ;;
    sparse)
        python3 -m flashtile.bench --modes sparse --out "$OUT/sparse" "$@" > "$OUT/sparse.log" 2>&1
        tail -40 "$OUT/sparse.log" ;;
    tune)
        python3 benchmarks/tune.py --out "$OUT/tune.json" "$@" 2>&1 | tee "$OUT/tune.log" | tail -12 ;;
    *)
        echo "unknown phase $phase: tests, bench, features, sparse or tune" >&2; exit 2 ;;
esac
