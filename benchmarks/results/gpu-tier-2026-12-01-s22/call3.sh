#!/bin/bash
# Session 22, call 3: the GPU tier's part 2 at a04b0a5 (tf32x3 dots for fp32 with TF32 off).
# run: bash benchmarks/results/gpu-tier-2026-12-01-s22/call3.sh   (repo root, $OUT set)
git log --oneline -1 2>/dev/null
bash benchmarks/gpu_session.sh tests 2
