#!/bin/bash
# Session 22, call 4: the GPU tier's part 1 at a04b0a5, then fp32 as configured (no candidates) for the README.
# run: bash benchmarks/results/gpu-tier-2026-12-01-s22/call4.sh   (repo root, $OUT set)
bash benchmarks/gpu_session.sh tests 1
PYTHONPATH=src timeout 150 python3 benchmarks/fp32_tiles.py --jobs 10 --out "$OUT/fp32" > "$OUT/fp32_tiles.log" 2>&1
echo "fp32 rc $?"; grep -c '"provider"' "$OUT/fp32_tiles.log"
